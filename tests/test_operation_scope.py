"""Capabilities and declared deviations scoped to one operation (``capabilities_for(op)``,
``"CLAUSE@op"`` deviation keys): the other operation is judged as usual."""

from __future__ import annotations

import os
import subprocess

from mhaspec import runner
from mhaspec.conformance import harness

from suite_runner import HERE, run_suite

REFS = ["scoped_backends:BIAS_ON_ATTENTION_ONLY", "scoped_backends:EMPTY_SIZES_FAIL_IN_MODULE"]


def _by_op(results, backend: str, clause: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in results:
        if r["backend"] == backend and clause in r["clauses"]:
            op = "mha" if r["nodeid"].endswith("-mha]") else "sdpa"
            out.setdefault(op, set()).add(r["outcome"])
    return out


def test_scoped_capabilities_and_deviations(tmp_path):
    results = run_suite(tmp_path, REFS, "-k", "bias or empty_sizes")
    # the module is not given a bias: its bias tests are not implemented, the function's pass
    assert _by_op(results, "scoped-bias-sdpa-only", "MASK-2") == {"sdpa": {"pass"},
                                                                  "mha": {"not-implemented"}}
    assert _by_op(results, "scoped-bias-sdpa-only", "MASK-11") == {"sdpa": {"pass"},
                                                                   "mha": {"not-implemented"}}
    # the module's deviation is confirmed; the function must still pass SHAPE-4
    assert _by_op(results, "scoped-empty-mha-deviates", "SHAPE-4") == {"sdpa": {"pass"},
                                                                      "mha": {"deviation"}}


def test_op_deviations_keeps_unscoped_and_this_operations_keys():
    declared = {"MASK-9": "a", "SHAPE-4@mha": "b", "NUM-6@sdpa": "c"}
    assert harness.op_deviations(declared, "mha") == {"MASK-9": "a", "SHAPE-4": "b"}
    assert harness.op_deviations(declared, "sdpa") == {"MASK-9": "a", "NUM-6": "c"}
    assert harness.op_deviations(declared, None) == {"MASK-9": "a"}


def test_claiming_more_for_one_operation_than_in_capabilities_is_a_usage_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(runner.command(runner.suite_args(
        backends=["scoped_backends:CLAIMS_MORE_FOR_ONE_OPERATION"], extra=["--collect-only"])),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "capabilities_for('mha') claims ['grad']" in out.stdout + out.stderr, out.stderr[-2000:]
