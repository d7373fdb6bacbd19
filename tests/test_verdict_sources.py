"""Who satisfied a clause (the library or its adapter's shared validation), and where a declared
deviation went stale: the clause entries, the certificate's consistency and its Markdown."""

from __future__ import annotations

import os
import pathlib

import pytest

from mhaspec import certificate, certificate_markdown, runner
from mhaspec.backends.validation import REJECTION_CLAUSES
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

import hostile_files

HERE = pathlib.Path(__file__).parent
CELLS = ("cpu/float64", "cpu/float32")


def _result(clauses, outcome, dtype="float64", by_adapter=()):
    return {"backend": "b", "device": "cpu", "dtype": dtype, "clauses": list(clauses),
            "outcome": outcome, "ratios": {}, "validated_by_adapter": list(by_adapter)}


def _entry(results, clause):
    spec = load_spec()
    claimed = {"cpu": ["float64", "float32"]}
    return next(c for c in verdicts.clause_verdicts(results, spec, claimed) if c["id"] == clause)


def test_a_pass_of_the_adapters_validation_is_marked_as_the_adapters():
    results = [_result(["ERR-1", "ERR-10"], "pass", d, by_adapter=["ERR-1", "ERR-10"])
               for d in ("float64", "float32")]
    entry = _entry(results, "ERR-10")
    assert (entry["verdict"], entry["satisfied_by"]) == ("pass", "adapter")
    assert verdicts.verdict_label(entry) == "pass (adapter)"
    # one run where the library itself was judged makes the pass the library's
    results.append(_result(["ERR-10"], "pass", "float32"))
    assert "satisfied_by" not in _entry(results, "ERR-10")


def test_adapter_passes_alone_do_not_make_a_backend_conform():
    spec = load_spec()
    results = [_result(["ERR-10"], "pass", d, by_adapter=["ERR-10"]) for d in ("float64", "float32")]
    clauses = verdicts.clause_verdicts(results, spec, {})
    assert verdicts.overall_verdict(clauses) == verdicts.NOT_CHECKED
    results += [_result(["SDPA-1"], "pass", d) for d in ("float64", "float32")]
    assert verdicts.overall_verdict(verdicts.clause_verdicts(results, spec, {})) == verdicts.CONFORMS


def test_stale_cells_are_named_when_the_clause_also_fails():
    results = [_result(["MASK-9"], "stale-deviation", "float64"),
               _result(["MASK-9"], "fail", "float32")]
    entry = _entry(results, "MASK-9")
    assert (entry["verdict"], entry["stale_on"]) == ("fail", ["cpu/float64"])
    assert verdicts.entry_problem(entry, REJECTION_CLAUSES) is None


def test_a_stale_deviation_names_its_cells():
    results = [_result(["MASK-9"], "stale-deviation", "float64"),
               _result(["MASK-9"], "deviation", "float32")]
    entry = _entry(results, "MASK-9")
    assert (entry["verdict"], entry["stale_on"]) == ("stale-deviation", ["cpu/float64"])
    assert verdicts.verdict_label(entry) == "stale-deviation (stale on cpu/float64)"
    assert verdicts.table_symbol("stale-deviation", entry) == "STALE*"
    assert any("MASK-9 on cpu/float64" in n for n in verdicts.backend_notes([entry]))


@pytest.mark.parametrize("change,problem", [
    ({"verdict": "fail", "satisfied_by": "adapter"}, "satisfied by"),
    ({"id": "SDPA-1", "satisfied_by": "adapter"}, "satisfied by"),
    ({"verdict": "stale-deviation"}, "stale_on"),
    ({"stale_on": ["cpu/float64"]}, "stale_on"),
    ({"verdict": "deviation", "stale_on": ["cpu/float64"]}, "stale_on"),
    ({"verdict": "stale-deviation", "stale_on": ["cuda/float16"]}, "did not run"),
])
def test_entry_fields_that_contradict_the_verdict_are_problems(change, problem):
    entry = {"id": "ERR-10", "verdict": "pass", "ran_on": list(CELLS), **change}
    assert problem in verdicts.entry_problem(entry, REJECTION_CLAUSES)


def _certificate(edit, deviations: dict | None = None) -> dict:
    body = hostile_files.certificate_body()
    body["backend"]["deviations"] = deviations or {}
    for c in body["clauses"]:
        edit(c)
    body["summary"] = {"verdict": verdicts.overall_verdict(body["clauses"]),
                       "counts": verdicts.count_verdicts(body["clauses"])}
    return certificate.verify(certificate.seal(body))


def test_the_certificate_and_its_markdown_carry_both_fields():
    def edit(c):
        if c["id"] == "SOFTCAP-2":
            c["satisfied_by"] = "adapter"
        if c["id"] == "MASK-9":
            c.update(verdict="stale-deviation", stale_on=["cpu/float64"])

    cert = _certificate(edit, {"MASK-9": "fully masked rows give the mean of V"})
    assert certificate.check_consistency(cert)
    assert cert["summary"]["verdict"] == verdicts.DOES_NOT_CONFORM
    md = certificate_markdown.to_markdown(cert)
    assert "| pass (adapter) |" in md and "| stale-deviation (stale on cpu/float64) |" in md
    assert "passed by the adapter's shared argument validation, not by the library" in md
    assert "SOFTCAP-2" in md.split("not by the library")[1].splitlines()[0]


def test_the_coverage_line_says_how_many_passes_were_the_adapters():
    from mhaspec import coverage

    cert = _certificate(lambda c: c.update(satisfied_by="adapter") if c["id"].startswith("ERR")
                        else None)
    assert "(10 by the adapter's argument validation)" in coverage.summary(coverage.of(cert))


def test_consistency_refuses_an_adapter_pass_on_a_value_clause():
    def edit(c):
        if c["id"] == "SDPA-1":
            c["satisfied_by"] = "adapter"

    with pytest.raises(certificate.CertificateError, match="SDPA-1"):
        certificate.check_consistency(_certificate(edit))


def _suite(tmp_path, ref: str, tests: str, dtypes: str = "float64"):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = runner.run_subprocess(
        runner.suite_args(backends=[ref], profile="triage", dtypes=dtypes,
                          extra=["-p", "no:xdist", "-k", tests]),
        cwd=tmp_path, env=env, timeout=600)
    assert run.results, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _run(tmp_path, ref: str, tests: str, clause: str) -> tuple[dict, list[dict]]:
    run = _suite(tmp_path, ref, tests)
    return _entry(run.results, clause), run.results


def _softcap2(tmp_path, ref: str) -> tuple[dict, list[dict]]:
    return _run(tmp_path, ref, "test_invalid_softcap", "SOFTCAP-2")


def test_a_library_judged_for_softcap_that_accepts_zero_fails_softcap_2(tmp_path):
    entry, _ = _softcap2(tmp_path, "library_checks:LEFT_TO_LIBRARY")
    assert entry["verdict"] == "fail", entry
    assert "satisfied_by" not in entry


def test_the_same_library_behind_shared_validation_passes_softcap_2_as_the_adapters(tmp_path):
    entry, results = _softcap2(tmp_path, "library_checks:SHARED")
    assert (entry["verdict"], entry.get("satisfied_by")) == ("pass", "adapter"), entry
    assert all(r["validated_by_adapter"] == ["SOFTCAP-2"] for r in results
               if r["clauses"] == ["SOFTCAP-2"])


def test_a_scale_left_to_the_library_is_judged_on_the_library(tmp_path):
    """ERR-10 left to the library: a negative scale reaches it and is accepted, so ERR-10 fails;
    ERR-1, named by the same test, is the library's there too (not marked as the adapter's)."""
    entry, results = _run(tmp_path, "library_checks:SCALE_LEFT_TO_LIBRARY",
                          "test_scale_must_be_positive or test_rank_is_checked", "ERR-10")
    assert entry["verdict"] == "fail", entry
    assert "accepted (no ValueError)" in entry["failures"][0]
    scale_runs = [r for r in results if "ERR-10" in r["clauses"]]
    assert scale_runs and all(r["validated_by_adapter"] == [] for r in scale_runs)
    rank = _entry(results, "ERR-3")
    assert (rank["verdict"], rank.get("satisfied_by")) == ("pass", "adapter"), rank


def test_the_rejection_clauses_are_those_only_rejection_tests_name(tmp_path):
    """REJECTION_CLAUSES (what an adapter's shared validation satisfies) is exactly the set of
    clauses every test of which requires "errors" (checks that invalid input is rejected): a
    clause with a value test too stays the library's."""
    import json
    import subprocess

    from test_clause_tags import DUMP_PLUGIN

    (tmp_path / "tagdump.py").write_text(DUMP_PLUGIN)
    dump = tmp_path / "tags.json"
    env = {**os.environ, "TAG_DUMP": str(dump),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(runner.command(runner.suite_args(
        backends=["numpy-batched"], extra=["-p", "tagdump", "--collect-only"])),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert dump.exists(), out.stdout[-2000:] + out.stderr[-2000:]
    by_clause: dict[str, set[bool]] = {}
    for row in json.loads(dump.read_text()):
        for clause in row["clauses"]:
            by_clause.setdefault(clause, set()).add("errors" in row["requires"])
    only_rejections = {c for c, kinds in by_clause.items() if kinds == {True}}
    assert only_rejections == REJECTION_CLAUSES


def test_the_terminal_summary_names_the_stale_cells(tmp_path):
    """A deviation declared in every dtype but stale in float32 only: the table marks it and a
    line names the cell, as does the backend's summary."""
    run = _suite(tmp_path, "broken_backends:STALE_DEVIATION_IN_FLOAT32",
                 "test_fully_masked_rows_give_zero", "float64,float32")
    assert "STALE* stale-deviation-float32 MASK-9: stale on cpu/float32\n" in run.stdout
    assert ("stale-deviation-float32: declared deviations that did not deviate (stale) in these "
            "cells: MASK-9 on cpu/float32") in run.stdout
    assert _entry(run.results, "MASK-9")["stale_on"] == ["cpu/float32"]


@pytest.mark.parametrize("left,words", [({"WIN-2"}, "can leave to its library only"),
                                        ({"SOFTCAP-2"}, "capability the adapter does not claim")])
def test_library_validates_is_checked_when_the_adapter_is_made(left, words):
    from mhaspec.backends.adapters import NumpyAdapter

    class Adapter(NumpyAdapter):
        capabilities = frozenset({"sdpa", "errors"})
        library_validates = frozenset(left)

    with pytest.raises(ValueError, match=words):
        Adapter("left-to-library")


def test_head_grouping_left_to_the_library_is_judged_on_the_library(tmp_path):
    entry, results = _run(tmp_path, "library_checks:GROUPING_LEFT_TO_LIBRARY",
                          "test_gqa_sdpa", "GQA-2")
    assert entry["verdict"] == "fail", entry
    assert "message does not name k" in entry["failures"][0]
    assert _entry(results, "GQA-1")["verdict"] == "pass"
