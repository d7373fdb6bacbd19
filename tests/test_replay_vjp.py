"""Gradient failures are saved and replayed (spec 1.4): a broken backward pass's failing
attention_vjp case, with its sinks and its lse cotangent, is saved by ``--mhaspec-failures`` and
``mhaspec replay`` judges its gradients again (it printed "conforms" for a wrong dq before: only the
forward pass was replayed, and a case with sinks could not be saved at all)."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from mhaspec import runner
from mhaspec.conformance import failure_file
from mhaspec.conformance.replay import replay
from suite_runner import HERE

#: broken backend -> the test whose failure is saved (GRAD-8: d_lse; SINK-3: sinks)
BROKEN = {"broken_backends:LSE_COTANGENT_IGNORED": "test_lse_cotangent_adds_dlse_times_p",
          "broken_backends:SINK_INDEXED_BY_KV_HEAD": "test_the_gradient_with_respect_to_the_sinks"}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, list[pathlib.Path]]:
    """backend reference -> the failure files its run saved (ci profile, float64)."""
    out = {}
    for ref, test in BROKEN.items():
        work = tmp_path_factory.mktemp("run")
        runner.run_subprocess(runner.suite_args(
            backends=[ref], profile="ci", dtypes="float64", failures=work / "failures",
            extra=["-n", "0", "-k", test]), cwd=work, env=ENV, timeout=900)
        out[ref] = sorted((work / "failures").glob("*.npz"))
    return out


def _mhaspec_replay(path, backend: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", "replay", str(path), "--backend",
                           backend], capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.parametrize("ref", sorted(BROKEN))
def test_a_saved_gradient_failure_replays_as_a_failure(saved, ref):
    assert saved[ref], f"{ref}: no failure saved"
    path = saved[ref][0]
    meta, _ = failure_file.read_case(path)
    assert meta["op"] == "attention_vjp"
    if "SINK" in ref:
        assert isinstance(meta["overrides"]["sinks"], np.ndarray)
    else:
        assert meta["overrides"]["d_lse"] is True
    still = _mhaspec_replay(path, ref)
    assert still.returncode == 1, still.stdout + still.stderr
    assert "attention_vjp gradients: DOES NOT CONFORM" in still.stdout
    fixed = _mhaspec_replay(path, "oracle_backend:ORACLE_REFERENCE")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "attention_vjp gradients: conforms" in fixed.stdout


def test_the_printed_reproducer_replays_the_gradient():
    """The reproducer a gradient failure prints (op "attention_vjp", sinks as a list) fails
    again on the broken backend and passes on the reference."""
    import broken_backends  # noqa: F401  (tests/ on the path: the reproducer's backend)
    from mhaspec.conformance.strategies import CaseSpec

    spec = CaseSpec(batch=1, heads=4, len_q=3, len_k=5, d_k=4, d_v=4, kv_heads=2, seed=5)
    sinks = {"sinks": [0.5, -1.0, 2.0, 1.5]}
    with contextlib.redirect_stdout(io.StringIO()):
        bad = replay("broken_backends:SINK_INDEXED_BY_KV_HEAD", "attention_vjp", spec,
                     dtype="float64", overrides=sinks)
        good = replay("oracle_backend:ORACLE_REFERENCE", "attention_vjp", spec, dtype="float64",
                      overrides=sinks)
    assert "DOES NOT CONFORM" in bad[0] and "[replay]" in bad[0]
    assert good[0].endswith("gradients: conforms")
