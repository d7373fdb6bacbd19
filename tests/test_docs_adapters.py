"""The two adapters printed in docs/backends.md ("Adapt a framework's attention with the helpers"),
run exactly as the page shows them: each Python block is written to a module and certified with
the ``ci`` profile in a subprocess, as a user would (``mhaspec certify module:BACKEND``).

The function-style backend (a NumPy stand-in for a FlashAttention-style kernel) must conform with
no deviation; the module-style one (``torch.nn.MultiheadAttention``) must conform with its two
declared deviations confirmed (MASK-9, MASK-13). The blocks must stay under 40 lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

DOCS_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "backends.md"
SECTION = "\n## Adapt a framework's attention with the helpers"


def docs_blocks() -> list[str]:
    """The Python blocks of the page's helpers section, in order (function, then module)."""
    section = DOCS_PAGE.read_text("utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def certify(tmp_path: pathlib.Path, module: str, source: str) -> dict:
    (tmp_path / f"{module}.py").write_text(source, "utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", f"{module}:BACKEND",
                           "--profile", "ci", "--output-dir", "certs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (cert,) = (tmp_path / "certs").glob("*.json")
    return json.loads(cert.read_text("utf-8"))


def verdicts(cert: dict) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in cert["clauses"]}


def test_the_page_has_both_blocks_under_40_lines():
    blocks = docs_blocks()
    assert len(blocks) == 2, "docs/backends.md: expected a function and a module example"
    for block in blocks:
        assert len(block.strip().splitlines()) < 40, block


def test_the_function_style_example_conforms(tmp_path):
    cert = certify(tmp_path, "flash_style_example", docs_blocks()[0])
    assert cert["summary"]["verdict"] == "conforms"
    seen = verdicts(cert)
    assert "deviation" not in seen.values()
    for clause in ("SDPA-1", "MASK-1", "MASK-2", "MASK-3", "MASK-7", "MASK-9", "MASK-13"):
        assert seen[clause] == "pass", (clause, seen[clause])


def test_the_module_style_example_conforms_with_its_deviations(tmp_path):
    pytest.importorskip("torch")
    cert = certify(tmp_path, "module_style_example", docs_blocks()[1])
    assert cert["summary"]["verdict"] == "conforms"
    seen = verdicts(cert)
    assert seen["MASK-9"] == seen["MASK-13"] == "deviation"
    for clause in ("MHA-1", "PARAM-1", "MASK-1", "MASK-5", "MASK-6", "MASK-7", "SHAPE-2"):
        assert seen[clause] == "pass", (clause, seen[clause])
