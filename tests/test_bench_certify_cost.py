"""python -m mhaspec.bench.certify_cost: the ci and certify profiles of one backend, side by side."""

from __future__ import annotations

import pytest

from mhaspec.bench import certify_cost


def test_both_profiles_run_as_a_user_runs_them_and_are_compared(capsys):
    assert certify_cost.main(["numpy-batched", "--seed", "3", "--",
                              "-k", "test_sdpa_output_is_b_h_lq_dv"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("certify-cost numpy-batched round 1, 1 worker: ci ")
    assert "certify (seed 3)" in line and ", ratio " in line
    # a selection leaves most clauses unrun: both certificates say so, and the same tests ran
    assert line.count("incomplete") == 2 and line.count(", 3 tests") == 2


def test_each_worker_count_runs_both_profiles(capsys):
    assert certify_cost.main(["numpy-batched", "--seed", "3", "--workers", "1", "2", "--",
                              "-k", "test_sdpa_output_is_b_h_lq_dv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "certify-cost numpy-batched round 1, 1 worker", "certify-cost numpy-batched round 1, 2 workers"]
    assert all(line.count(", 3 tests") == 2 for line in lines)


def test_a_certificate_is_described_by_its_verdict_tally_and_tests():
    certificate = {"summary": {"verdict": "conforms", "counts": {"pass": 97, "not-implemented": 2}},
                   "run": {"tests_run": 660}}
    assert certify_cost.describe(certificate) == "conforms (2 not-implemented, 97 pass), 660 tests"


def test_an_unknown_backend_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        certify_cost.main(["nosuch:thing"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err, err
