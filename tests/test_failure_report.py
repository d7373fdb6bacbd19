"""How failures are reported: grouped by likely cause (one cause fails many clauses), shrunk only
for the first failure of a backend x device x dtype cell unless ``--mhaspec-shrink-all``, every
failing case with arrays saved for replay, and each failure a short readable text (clause, case,
expected vs got, replay line) in both certificate forms.

On 3a51267 none of this held: a float32 softmax in the float64 path shrank every one of its ~40
failures (5x the run's time), property and exception failures saved no case (27 files for 108
failed tests), and certificate failures were the last 4000 characters of a traceback."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from mhaspec import certificate, certificate_markdown, runner
from mhaspec.conformance import failure_file, failure_save, verdicts
from mhaspec.conformance.strategies import CaseSpec

from suite_runner import HERE, run_suite

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
FLOAT32_INSIDE = "broken_backends:FLOAT32_SOFTMAX_IN_FLOAT64"
ONE_WIDTH = "broken_backends:VALUE_WIDTH_MUST_EQUAL_KEY_WIDTH"
SOME_TESTS = ["-k", "test_sdpa or test_mha"]


def _ci_run(tmp_path, *extra):
    return runner.run_subprocess(
        runner.suite_args(backends=[FLOAT32_INSIDE], profile="ci", dtypes="float64,float32",
                          extra=[*SOME_TESTS, *extra]),
        cwd=tmp_path, env=ENV, timeout=1200)


def test_one_cause_is_one_group_and_only_the_first_failure_of_a_cell_is_shrunk(tmp_path):
    run = _ci_run(tmp_path)
    failed = [r for r in run.results if r["outcome"] == "fail"]
    assert failed and {r["dtype"] for r in failed} == {"float64"}, run.stdout[-3000:]
    shrunk = [r["shrunk"] for r in failed if r["shrunk"] is not None]  # None: not a Hypothesis test
    assert shrunk.count(True) == 1 and shrunk.count(False) == len(shrunk) - 1 >= 5, shrunk
    groups = verdicts.failure_groups(run.results)
    assert len(groups) == 1, groups
    assert "float32 arithmetic inside the float64 path" in groups[0]["cause"]
    assert groups[0]["cells"] == ["cpu/float64"] and len(groups[0]["clauses"]) >= 5
    assert 1e-12 <= groups[0]["typical_relative_error"] < 1e-5
    assert "mhaspec failures by likely cause" in run.stdout
    assert "float32 arithmetic inside the float64 path?" in run.stdout


def test_shrink_all_shrinks_every_failure(tmp_path):
    run = _ci_run(tmp_path, "--mhaspec-shrink-all")
    shrunk = [r["shrunk"] for r in run.results if r["outcome"] == "fail" and r["shrunk"] is not None]
    assert len(shrunk) >= 5 and all(shrunk), shrunk


def test_an_unsupported_width_is_one_cause_and_every_failing_case_is_saved(tmp_path):
    failures = tmp_path / "failures"
    results = run_suite(tmp_path, [ONE_WIDTH, "broken_backends:MASK_MEAN_OF_V_DECLARED_BIAS_ZERO"],
                        "--mhaspec-failures", str(failures), "-k",
                        "test_sdpa or test_mha or minus_inf_bias")
    failed = [r for r in results if r["outcome"] == "fail"]
    raised = [g for g in verdicts.failure_groups(results) if g["backend"] == "broken-dv-must-equal-dk"
              and "ValueError: d_v (N) must equal d_k (N)" in g["cause"]]
    assert raised and len(raised[0]["clauses"]) >= 2, verdicts.failure_groups(results)
    # exceptions (the one width) and a property (MASK-11) saved as well as oracle comparisons
    assert any(r["backend"] == "broken-mask-vs-bias-masked-rows" for r in failed)
    assert failed and all(r.get("replay") for r in failed), [r["nodeid"] for r in failed
                                                             if not r.get("replay")]
    saved = sorted(failures.glob("*.npz"))
    assert len(saved) == len(failed)
    for path in saved:
        meta, _ = failure_file.read_case(path)
        assert meta["clause"]
    for r in failed:
        assert r["message"].startswith(r["nodeid"].split("::")[-1]), r["message"][:200]
        assert "replay: mhaspec replay " in r["message"] or "or: mhaspec replay " in r["message"]
        assert "Traceback" not in r["message"] and "\nE  " not in r["message"]


def test_certificate_failures_are_readable_and_grouped(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mhaspec.cli", "certify", FLOAT32_INSIDE, "--profile", "ci",
         "--output-dir", "out", "--", "--mhaspec-dtypes", "float64", "-k", "test_sdpa"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = tmp_path / "out" / "broken-float32-in-float64.json"
    cert = certificate.verify(json.loads(path.read_text("utf-8")))
    certificate.check_consistency(cert)
    assert cert["run"]["shrink"] == "first failure of each cell"
    assert cert["run"]["failures_not_shrunk"] >= 1
    (group,) = cert["failure_groups"]
    assert "float32 arithmetic inside the float64 path" in group["cause"] and "SDPA-1" in group["clauses"]
    messages = [m for c in cert["clauses"] for m in c["failures"]]
    assert messages
    for m in messages:
        first = m.splitlines()[0]
        assert first.startswith("test_") and "(cpu, float64)" in first, first
        # expected vs got: the oracle comparison's error, or a property's difference
        assert "differs from the float64 oracle: max abs error" in m or "max abs difference" in m
        assert "CaseSpec(" in m and "mhaspec replay " in m
        assert "Traceback" not in m and "\nE  " not in m
    text = pathlib.Path(str(path).replace(".json", ".md")).read_text("utf-8")
    assert text == certificate_markdown.to_markdown(cert)
    assert "## Failures by likely cause" in text and "float32 arithmetic inside the float64 path" in text


def test_array_overrides_are_saved_as_the_cases_own_arrays(tmp_path):
    """A call's mask replaced by its -inf bias (MASK-11) is saved as a case with that bias and no
    mask, and reads back so; an override the format cannot hold is not saved at all."""
    import numpy as np

    from mhaspec.conformance.harness import Cell
    from mhaspec.conformance.strategies import CaseSpec, build_case

    case = build_case(CaseSpec(mask_shape=(2, 1, 3, 3), fully_masked_rows=True, seed=1))
    bias = np.where(case.mask, 0.0, -np.inf)
    fitted, scalars = failure_save.saveable(case, {"mask": None, "bias": bias, "causal": "top_left"})
    assert fitted.mask is None and fitted.spec.mask_shape is None and fitted.spec.bias_shape == (2, 1, 3, 3)
    assert scalars == {"causal": "top_left"}
    impl = Cell(None, "cpu", "float64")
    path = failure_save.save_case(tmp_path / "c.npz", impl, fitted, op="sdpa", clause="MASK-11",
                                  backend_ref="b", overrides=scalars)
    meta, back = failure_file.read_case(path)
    assert back.mask is None and np.array_equal(back.bias, bias) and meta["overrides"] == scalars
    assert failure_save.saveable(case, {"window": (2, None)}) is None


def test_failure_groups_from_results():
    """One group per backend and cause, largest first; passes and deviations are not grouped."""
    base = {"backend": "b", "device": "cpu", "outcome": "fail", "ratios": {}}
    results = [
        {**base, "dtype": "float64", "clauses": ["SDPA-1"], "failure": {"error": 2e-7, "scale": 2.0}},
        {**base, "dtype": "float64", "clauses": ["MHA-1"], "failure": {"error": 1e-7, "scale": 1.0}},
        {**base, "dtype": "float32", "clauses": ["SDPA-3"], "crash": "ValueError: d_v (8) != d_k (4)"},
        {**base, "dtype": "float64", "clauses": ["MHA-4"], "crash": "ValueError: d_v (2) != d_k (1)"},
        {**base, "dtype": "float64", "clauses": ["MASK-9"], "outcome": "deviation"},
        {**base, "dtype": "float64", "clauses": ["MASK-1"], "outcome": "pass"},
    ]
    groups = verdicts.failure_groups(results)
    assert [(g["clauses"], g["cells"], g["tests"]) for g in groups] == [
        (["MHA-1", "SDPA-1"], ["cpu/float64"], 2), (["MHA-4", "SDPA-3"], ["cpu/float32", "cpu/float64"], 2)]
    assert groups[0]["typical_relative_error"] == 1e-7 and "float32 arithmetic" in groups[0]["cause"]
    assert "ValueError: d_v (N) != d_k (N)" in groups[1]["cause"]
    assert groups[1]["typical_relative_error"] is None
    assert verdicts.describe_group(groups[0]).startswith("b: 2 clauses (2 tests) on cpu/float64 fail by ~1e-07")


def test_informative_clauses_and_large_ratios_read_as_the_terminal_words_them(capsys):
    """Old: the certificate's Markdown and ``verify`` said "not-run" for informative clauses (the
    terminal: "2 informative" next to "0 not run" tests) and printed ratios with two decimals
    (1477874627492827.50); now "informative" and :func:`tolerance.format_ratio` everywhere."""
    from mhaspec import cli

    path = HERE.parent / "docs" / "certificates" / "torch-sdpa.json"
    cert = json.loads(path.read_text("utf-8"))
    informative = {c["id"] for c in cert["clauses"] if c["verdict"] == "not-run"}
    # no test: the informative clauses of the certificate's version (1.4: CHUNK-3 joins 1.3's)
    assert informative == {cid for cid, _, testable in certificate.released_clauses(
        cert["spec"]["version"]) if not testable} == {"MASK-4", "WIN-3", "CONF-1", "CHUNK-3"}
    big = dict(next(c for c in cert["clauses"] if c["id"] == "SDPA-1"), worst_ratio=1477874627492827.5)
    rows = certificate_markdown.to_markdown({**cert, "clauses": [big if c["id"] == "SDPA-1" else c
                                                         for c in cert["clauses"]]}).splitlines()
    assert "| SDPA-1 | The attention equation | pass | 1.48e+15 | 4 |" in "\n".join(rows)
    for cid in informative:
        assert next(r for r in rows if r.startswith(f"| {cid} |")).split(" | ")[2] == "informative"
    assert not [r for r in rows if "not-run" in r]
    assert cli.main(["verify", str(path)]) == 0
    summary = next(line for line in capsys.readouterr().out.splitlines() if "the summary" in line)
    assert f"{len(informative)} informative" in summary and "not-run" not in summary, summary


def test_a_failure_in_an_emptied_row_is_one_cause_and_the_common_fields_are_named():
    """Failures whose largest error lies in a row with no allowed key group under one cause,
    whatever clause failed (issue 35: a fully masked row failed 8-10 other clauses, grouped as
    "the computation itself?"), and a group names the case fields every failure shared."""
    base = {"backend": "b", "device": "cpu", "dtype": "float32", "outcome": "fail", "ratios": {}}
    fields = verdicts.case_fields(CaseSpec(d_k=1, d_v=1, use_bias=True))
    results = [
        {**base, "clauses": ["MASK-7"], "failure": {"error": 0.6, "scale": 1.0, "in_empty_row": True,
                                                    "case_fields": {**fields, "causal": "bottom_right"}}},
        {**base, "clauses": ["MASK-13"], "failure": {"error": 0.7, "scale": 1.0, "in_empty_row": True,
                                                     "case_fields": fields}},
        {**base, "clauses": ["SDPA-1"], "failure": {"error": 0.7, "scale": 1.0,
                                                    "case_fields": fields}},
    ]
    groups = verdicts.failure_groups(results)
    empty = next(g for g in groups if g["cause"] == verdicts.EMPTY_ROW_CAUSE)
    assert empty["clauses"] == ["MASK-13", "MASK-7"] and empty["tests"] == 2
    assert empty["common"] == {"d_k": "1", "d_v": "1", "use_bias": "True"}
    assert "common to every failing case: d_k=1, d_v=1, use_bias=True" in verdicts.describe_group(empty)
    other = next(g for g in groups if g["cause"] != verdicts.EMPTY_ROW_CAUSE)
    assert other["common"] == {}  # one case: nothing to compare
    own = {**base, "clauses": ["MASK-9"], "crash": "AssertionError: fully masked rows must give 0"}
    assert verdicts.likely_cause(own) == verdicts.EMPTY_ROW_CAUSE  # MASK-9's own test


def test_the_oracle_says_which_rows_are_empty():
    """in_empty_row reads the oracle's weights: a row whose weights are all 0 has no allowed key;
    for multi-head attention's output, a row empty in every head."""
    import numpy as np

    from mhaspec.conformance import expect
    from mhaspec.conformance.cell import Result

    weights = np.ones((1, 2, 3, 4))
    weights[0, :, 1] = 0  # row 1 empty in both heads
    weights[0, 0, 2] = 0  # row 2 empty in head 0 only
    sdpa = Result(np.zeros((1, 2, 3, 5)), weights)
    assert expect.in_empty_row(sdpa, "output", (0, 0, 1, 3))
    assert expect.in_empty_row(sdpa, "output", (0, 0, 2, 0)) and not expect.in_empty_row(
        sdpa, "output", (0, 1, 2, 0))
    mha = Result(np.zeros((1, 3, 6)), weights)
    assert expect.in_empty_row(mha, "output", (0, 1, 5))
    assert not expect.in_empty_row(mha, "output", (0, 2, 5))  # head 1 attends
    assert not expect.in_empty_row(Result(np.zeros((1, 3, 6)), None), "output", (0, 1, 5))
    assert not expect.in_empty_row(sdpa, "lse", (0, 0, 1))
