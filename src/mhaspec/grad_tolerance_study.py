"""Measure GRAD-10's rule: 16-bit gradients against the float64 oracle and the reference evaluation.

    python -m mhaspec.grad_tolerance_study [--cases N] [--backend NAME ...] [--dtype D ...]
                                           [--run-dtype D]

For N random attention_vjp calls (every feature the backend claims, masks, bias, key padding,
causal, emptied rows; d_lse and sinks where claimed) each gradient of each backend is compared with
the float64 oracle: ``e``, the reference evaluation's error ``e_ref`` in the dtype
(``oracle_vjp``'s 16-bit backward, GRAD-10) and GRAD-1's floor ``C u kappa max|g*|``. Printed per
backend and dtype: the cases, the worst ``k_needed = (e - floor) / e_ref`` (the smallest k with no
failure), the worst ratio ``e / (e_ref + floor / K)`` of the rule (a case fails iff it exceeds
``K``) and the failures. ``--run-dtype float64`` runs the backend in float64 on the same cases and
judges it as the dtype's cell (how the catalogue's wrong backward passes, which compute in float64
with one mistake, are measured in float16 and bfloat16: only their mistake is counted).
"""

from __future__ import annotations

import argparse

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mhaspec.backends import load_backend
from mhaspec.conformance import harness, tolerance, vjp
from mhaspec.conformance.strategies import feature_specs
from mhaspec.spec import oracle

#: other floor constants c for which the smallest safe k is reported too
FLOOR_MENU = (4.0, 1.0, 0.25)
FEATURES = ("softcap", "window", "alibi", "gqa", "cache", "segments", "seq_lengths")


def draw(cases: int) -> list:
    """``cases`` derandomized (spec, with_d_lse, sink_scale or None) draws."""
    out = []

    @settings(max_examples=cases, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=feature_specs(allow=FEATURES, masks=True, bias=True, key_padding=True,
                              causal=True, fully_masked=True, custom_scale=True),
           d_lse=st.booleans(), sink=st.sampled_from((None, 0.0, 1.0, -8.0, 8.0)))
    def collect(spec, d_lse, sink):
        out.append((spec, d_lse, sink))

    collect()
    return out


def measure_cell(name: str, dtype: str, draws: list, run_dtype: str | None = None) -> dict:
    """Worst figures of ``name``'s attention_vjp in ``dtype`` (run in ``run_dtype``, default the
    dtype) over ``draws``: cases, gradients, k_needed, ratio, failures (at K)."""
    backend = load_backend(name)
    judged = harness.Cell(backend, "cpu", dtype)
    runner = harness.Cell(backend, "cpu", run_dtype or dtype)
    caps = backend.capabilities
    stats = {"cases": 0, "gradients": 0, "k_needed": 0.0, "ratio": 0.0, "failures": 0,
             "worst": None, **{f"k_needed_c{c:g}": 0.0 for c in FLOOR_MENU}}
    for spec, with_d_lse, sink_scale in draws:
        case = judged.case(spec, "sdpa")
        d_lse = with_d_lse and "lse" in caps
        sinks = None if sink_scale is None or "sink" not in caps else vjp.sinks_of(case, sink_scale)
        problem = oracle.attention_problem(case.q, case.k, case.v, **vjp.kwargs_of(case))
        try:
            got = vjp.run(runner, case, d_lse=d_lse, sinks=sinks)
        except (NotImplementedError, ValueError):
            continue
        want, naive, scale = vjp.references(judged, case, problem, d_lse=d_lse, sinks=sinks)
        floor = tolerance.C * tolerance.UNIT_ROUNDOFF[dtype] * scale
        stats["cases"] += 1
        for key in want:
            verdict = tolerance.judge(got[key], want[key], naive[key], dtype=dtype, scale=scale)
            stats["gradients"] += 1
            need = (verdict.error - floor) / verdict.ref_error if verdict.ref_error > 0 else (
                0.0 if verdict.error <= floor else np.inf)
            stats["k_needed"] = max(stats["k_needed"], need)
            for c in FLOOR_MENU:
                low = c * tolerance.UNIT_ROUNDOFF[dtype] * scale
                need_c = (verdict.error - low) / verdict.ref_error if verdict.ref_error > 0 else (
                    0.0 if verdict.error <= low else np.inf)
                stats[f"k_needed_c{c:g}"] = max(stats[f"k_needed_c{c:g}"], need_c)
            if verdict.ratio > stats["ratio"]:
                stats["ratio"], stats["worst"] = verdict.ratio, (spec.seed, key)
            stats["failures"] += not verdict.ok
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhaspec.grad_tolerance_study",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--backend", action="append", required=True)
    parser.add_argument("--dtype", action="append", default=None,
                        help="float16 / bfloat16 (default: both)")
    parser.add_argument("--run-dtype", default=None)
    args = parser.parse_args(argv)
    draws = draw(args.cases)
    for name in args.backend:
        for dtype in args.dtype or ("float16", "bfloat16"):
            if args.run_dtype is None and dtype not in load_backend(name).dtypes("cpu"):
                continue
            s = measure_cell(name, dtype, draws, args.run_dtype)
            print(f"{name} {dtype}: {s['cases']} cases, {s['gradients']} gradients, "
                  f"k_needed {s['k_needed']:.3g} ("
                  + ", ".join(f"c={c:g}: {s[f'k_needed_c{c:g}']:.3g}" for c in FLOOR_MENU)
                  + f"), worst ratio {s['ratio']:.3g} at {s['worst']}, "
                  f"{s['failures']} failures at K={tolerance.K:g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
