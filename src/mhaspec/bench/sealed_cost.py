"""What the sealed path costs: the suite on one backend in-process and in its own process, side by
side in one run, with the clause verdicts of both (they must be the same).

``python -m mhaspec.bench.sealed_cost BACKEND [--profile ci] [--seed 0] [--rounds 1] [--no-warmup]
[-- PYTEST_ARGS]``

Each round runs the in-process suite (the backend loaded here) and the sealed one
(:mod:`mhaspec.sealed`), each with the oracle's cache emptied first, after one sealed warm-up run
(imports, assertion rewriting; ``--no-warmup`` skips it where only the verdicts matter, e.g. the slow
JAX and flex backends). Prints the seconds of each, their ratio and every clause whose entry differs:
its verdict, ``satisfied_by`` or ``stale_on``.
"""

from __future__ import annotations

import argparse
import time

from mhaspec import runner, sealed, usage
from mhaspec.conformance import judge, verdicts
from mhaspec.spec import load as load_spec


def run_suite(backend, ref: str, *, profile: str, seed: int, extra: list[str]) -> tuple[float, dict]:
    """Seconds of one run of the suite on ``backend`` and its clause id -> (verdict, satisfied_by,
    stale_on)."""
    judge.clear_oracle_cache()  # each run computes its own oracle
    args = runner.suite_args(backends=[ref], profile=profile, seed=seed, extra=extra)
    started = time.monotonic()
    run = runner.run_in_process(args, backends=[backend], refs={backend.name: ref})
    seconds = time.monotonic() - started
    results = [r for r in run.collector.results if r["backend"] == backend.name]
    clauses = verdicts.clause_verdicts(results, load_spec(), run.collector.claimed()[backend.name],
                                       run.collector.not_run())
    return seconds, {c["id"]: (c["verdict"], c.get("satisfied_by"), tuple(c.get("stale_on", ())))
                     for c in clauses}


def tally(entries: dict) -> str:
    """``"2 informative, 73 pass"``: the clause counts as certify words them."""
    return verdicts.describe_counts([{"id": c, "verdict": v} for c, (v, _, _) in entries.items()],
                                    load_spec().testable_ids)


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec.bench.sealed_cost", description=__doc__.split("\n")[0])
    parser.add_argument("backend")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the sealed warm-up run (timings then include imports)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    try:
        inside = usage.checked_backend(args.backend)
    except usage.UsageError as exc:  # one line, not a traceback
        usage.fail(str(exc))
    try:
        own = sealed.open_sealed(args.backend, call_timeout=60.0)
    except sealed.SealedError as exc:
        usage.fail(str(exc))
    kw = dict(profile=args.profile, seed=args.seed, extra=args.pytest_args)
    try:
        if args.warmup:
            run_suite(own, args.backend, **kw)
        for i in range(args.rounds):
            t_in, v_in = run_suite(inside, args.backend, **kw)
            t_own, v_own = run_suite(own, args.backend, **kw)
            differ = {c: (v_in.get(c), v_own.get(c)) for c in sorted(set(v_in) | set(v_own))
                      if v_in.get(c) != v_own.get(c)}
            print(f"sealed-cost {args.backend} round {i + 1}: in-process {t_in:.1f} s, sealed "
                  f"{t_own:.1f} s, ratio {t_own / t_in:.2f}; clause verdicts differ: "
                  f"{differ or 'none'} ({len(v_in)} clauses; {tally(v_in)})", flush=True)
    finally:
        own.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
