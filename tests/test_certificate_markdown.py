"""A certificate's Markdown is rendered without the suite: neither pytest nor Hypothesis is
imported (a reader of certificates needs neither), and the published renderings are still those of
their JSON.

Axis legend: none (certificates and their pages).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: a published certificate whose clauses record the conditions that ran
PUBLISHED = ROOT / "docs" / "certificates" / "torch-sdpa.json"

RENDER = """\
import json, pathlib, sys
from mhaspec import certificate, certificate_markdown
path = pathlib.Path(sys.argv[1])
cert = certificate.verify(certificate.loads(path.read_bytes()))
same = certificate_markdown.to_markdown(cert) == path.with_suffix(".md").read_text("utf-8")
print(json.dumps({"same": same, "imported": sorted(
    m for m in ("pytest", "_pytest", "hypothesis") if m in sys.modules)}))
"""


def test_rendering_a_certificate_imports_neither_pytest_nor_hypothesis():
    assert any(c.get("conditions") for c in json.loads(PUBLISHED.read_text("utf-8"))["clauses"])
    out = subprocess.run([sys.executable, "-c", RENDER, str(PUBLISHED)], capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == {"same": True, "imported": []}
