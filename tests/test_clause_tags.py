"""A conformance test may name a clause only if it requires every capability the clause needs
(``mhaspec.conformance.clause_capabilities.NEEDS``): else a backend that does not claim the
capability reports the clause as passed by tests that never exercised it (on 3a51267
``test_two_inputs_that_are_one_array`` named MHA-4 without requiring ``cross``)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import textwrap

from mhaspec import runner
from mhaspec.backends import CAPABILITIES
from mhaspec.conformance.clause_capabilities import NEEDS, untestable_tags
from mhaspec.spec import load

ROOT = pathlib.Path(__file__).resolve().parent.parent

DUMP_PLUGIN = '''
import json, os

def pytest_collection_modifyitems(session, config, items):
    rows = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        rows.append({"test": item.originalname, "op": params.get("op"),
                     "clauses": [c for m in item.iter_markers("clause") for c in m.args],
                     "requires": [c for m in item.iter_markers("requires") for c in m.args]})
    with open(os.environ["TAG_DUMP"], "w") as f:
        json.dump(rows, f)
'''


def _pytest(tmp_path, *args, env_extra=None):
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_every_conformance_test_requires_what_its_clauses_need(tmp_path):
    (tmp_path / "tagdump.py").write_text(DUMP_PLUGIN)
    dump = tmp_path / "tags.json"
    # the dump is independent of the plugin's own check (which refuses the run before it)
    out = _pytest(tmp_path, *runner.suite_args(backends=["numpy-batched"],
                                               extra=["-p", "tagdump", "--collect-only"]),
                  env_extra={"TAG_DUMP": str(dump)})
    rows = json.loads(dump.read_text()) if dump.exists() else []
    assert rows, out.stdout[-2000:] + out.stderr[-2000:]
    wrong = {}
    for row in rows:
        have = set(row["requires"]) | ({row["op"]} if row["op"] else set())
        for clause, missing in untestable_tags(row["clauses"], have).items():
            wrong[f"{row['test']} names {clause}"] = missing
    assert not wrong, f"tests naming clauses they cannot exercise: {wrong}"
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_needs_table_names_spec_clauses_and_capabilities():
    ids = {c.id for c in load().clauses}
    assert set(NEEDS) <= ids
    assert set().union(*NEEDS.values()) <= CAPABILITIES


def test_the_docs_capability_table_is_the_needs_table():
    """docs/backends.md lists, for each capability, exactly the clauses that need it, and the
    clauses needing none in the sentence after the table."""
    text = (ROOT / "docs" / "backends.md").read_text("utf-8")
    table = text[text.index("| capability | the backend provides |"):]
    rows = re.findall(r"^\| `([a-z_]+)`(?: \(optional\))? \|.*\|(.*)\|$",
                      table[:table.index("\n\n")], re.M)
    link = re.compile(r"\[([A-Z]+-[0-9]+)\]\(spec/index\.md#\1\)")
    listed = {cap: set(link.findall(cell)) for cap, cell in rows}
    wanted = {cap: {c for c, caps in NEEDS.items() if cap in caps} for cap in listed}
    assert listed == wanted
    assert set().union(*NEEDS.values()) <= set(listed), "a capability some clause needs has no row"
    sentence = table[table.index("Needing no capability of their own"):]
    sentence = sentence[:sentence.index("\n\n")]
    free = set(link.findall(sentence[:sentence.index(". ")]))
    assert free == set(load().testable_ids) - set(NEEDS)


def test_the_plugin_refuses_a_test_naming_a_clause_it_cannot_exercise(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.clause("MHA-4")
        @pytest.mark.requires("mha")
        def test_cross_without_cross(impl):
            pass
    '''))
    out = _pytest(tmp_path, "test_mine.py", "-q", "--backend", "numpy-batched",
                  "--mhaspec-partial")
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    assert "test_cross_without_cross names MHA-4 (needs ['cross'])" in out.stderr
