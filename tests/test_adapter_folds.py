"""Who served a feature: the library's own mechanism, or the adapter's fold of it into the masks.

A native adapter whose library lacks a window (segments, ALiBi, a cache, sinks) still serves the
feature through the generic path, which folds it into the boolean mask before the library is
called. A pass of that feature's clauses is then the adapter's: each test's result lists what
the adapter folded (``folded_by_adapter``, asked of the backend after every test, across the
sealed path under ``certify``), and the clause entry says ``satisfied_by: "adapter fold"``, its
Markdown ``pass (adapter fold)``, the coverage line and the scoreboard ``WIN (adapter fold)``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from mhaspec import certificate, coverage, runner
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

import fold_adapters
import hostile_files

HERE = pathlib.Path(__file__).parent


def _window_call(backend, **kw):
    rng = np.random.default_rng(0)
    q, k, v = (backend.asarray(rng.standard_normal(s), dtype="float64")
               for s in ((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 3)))
    return backend.scaled_dot_product_attention(q, k, v, window=(1, 0), **kw)


@pytest.mark.parametrize("backend, plain, causal", [
    (fold_adapters.FOLDING, ["window"], ["window"]),
    (fold_adapters.OWN_WINDOW, [], []),
    (fold_adapters.HALF_OWN, ["window"], [])], ids=["fold", "own", "half"])
def test_each_call_says_who_served_its_window_and_the_answer_is_taken_once(backend, plain, causal):
    _window_call(backend, alignment="bottom_right")
    assert backend.folded_by_adapter() == plain
    assert backend.folded_by_adapter() == []  # forgotten once taken
    _window_call(backend, causal="bottom_right")
    assert backend.folded_by_adapter() == causal


def test_one_call_by_the_library_keeps_the_credit_the_librarys():
    backend = fold_adapters.HALF_OWN
    _window_call(backend, alignment="bottom_right")  # folded
    _window_call(backend, causal="bottom_right")  # the library's own window
    assert backend.folded_by_adapter() == []


def _run(outcome="pass", folded=("window",)):
    return {"outcome": outcome, "clauses": ["WIN-1"], "folded_by_adapter": list(folded)}


@pytest.mark.parametrize("runs, expected", [
    ([_run(), _run()], verdicts.ADAPTER_FOLD),
    ([_run(), _run(folded=())], None),  # one test judged the library's window
    ([_run(), _run("not-implemented", ())], verdicts.ADAPTER_FOLD),  # did not exercise it
    ([_run(folded=("segments",))], None),  # another feature folded
    ([], None)], ids=["every-run", "one-by-library", "not-exercised", "other-feature", "none"])
def test_a_pass_is_the_adapters_fold_only_when_every_run_folded_its_feature(runs, expected):
    assert verdicts.satisfied_by("WIN-1", runs) == expected


def test_only_clauses_of_folded_features_can_be_passed_by_the_fold():
    assert verdicts.folded_feature("WIN-1") == {"window"}
    assert verdicts.folded_feature("CACHE-2") == {"kv_cache"}
    assert verdicts.folded_feature("MASK-1") == frozenset()
    assert verdicts.satisfied_by("MASK-1", [{"outcome": "pass", "folded_by_adapter": ["window"]}]) \
        is None


@pytest.mark.parametrize("clause, verdict, problem", [
    ("MASK-1", "pass", "only a pass of a clause of a folded feature"),
    ("WIN-1", "fail", "only a pass of a clause of a folded feature"),
    ("WIN-1", "pass", None)])
def test_the_certificate_refuses_a_fold_where_none_can_be(clause, verdict, problem):
    entry = {"id": clause, "verdict": verdict, "satisfied_by": verdicts.ADAPTER_FOLD,
             "ran_on": ["cpu/float64"]}
    got = verdicts.entry_problem(entry, frozenset())
    assert (got is None) if problem is None else (problem in got), got


def _certificate(folded: set[str]) -> dict:
    body = hostile_files.certificate_body()
    for c in body["clauses"]:
        if c["id"] in folded:
            c["satisfied_by"] = verdicts.ADAPTER_FOLD
    return body


def test_the_coverage_line_and_the_markdown_name_the_folded_chapter():
    body = _certificate({"WIN-1", "SEG-3"})
    certificate.check_consistency(body)
    cov = coverage.of(body)
    assert (cov.by_fold, set(cov.folded)) == (2, {"WIN", "SEG"})
    summary = coverage.summary(cov)
    assert "2 by the adapter's fold" in summary, summary
    assert "WIN (adapter fold)" in summary and "SEG (adapter fold)" in summary, summary
    assert "GQA (adapter fold)" not in summary
    notes = verdicts.backend_notes(body["clauses"])
    assert any("2 passed by the adapter's fold" in n and "WIN-1, SEG-3" in n for n in notes), notes


def test_a_fold_on_a_clause_without_a_folded_feature_is_refused_by_verify():
    with pytest.raises(certificate.CertificateError, match="MASK-1"):
        certificate.check_consistency(_certificate({"MASK-1"}))


def test_the_suite_credits_the_fold_and_the_librarys_window_apart(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    refs = [f"fold_adapters:{n}" for n in ("FOLDING", "OWN_WINDOW", "HALF_OWN")]
    run = runner.run_subprocess(runner.suite_args(backends=refs, profile="ci", dtypes="float64",
                                                  extra=["-p", "no:xdist", "-k", "WIN-1 or window"]),
                                cwd=tmp_path, env=env, timeout=600)
    spec = load_spec()
    claimed = {"cpu": ["float64"]}
    by = {}
    for name in ("window-by-fold", "window-by-library", "window-by-library-when-causal"):
        results = [r for r in run.results if r["backend"] == name]
        entry = next(c for c in verdicts.clause_verdicts(results, spec, claimed) if c["id"] == "WIN-1")
        by[name] = (entry["verdict"], entry.get("satisfied_by"))
    assert by == {"window-by-fold": ("pass", "adapter fold"), "window-by-library": ("pass", None),
                  "window-by-library-when-causal": ("pass", None)}, run.stdout[-3000:]


def test_certify_carries_the_fold_across_the_sealed_path(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", "fold_adapters:FOLDING",
                           "--profile", "ci", "--output-dir", "certs", "--", "-k", "window"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    cert = json.loads((tmp_path / "certs" / "window-by-fold.json").read_text("utf-8"))
    entry = next(c for c in cert["clauses"] if c["id"] == "WIN-1")
    assert (entry["verdict"], entry.get("satisfied_by")) == ("pass", "adapter fold"), \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    covers = next(line for line in (tmp_path / "certs" / "window-by-fold.md").read_text(
        "utf-8").splitlines() if line.startswith("| covers |"))
    assert "by the adapter's fold" in covers and "(adapter fold)" in covers.split(
        "optional chapters:")[1], covers
