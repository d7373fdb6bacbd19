"""What a thorough certificate costs against a ci one: ``mhaspec certify`` of one backend with the
ci profile and with the certify profile, side by side in one run, and the ratio of their times.

``python -m mhaspec.bench.certify_cost BACKEND [--seed 0] [--rounds 1] [--workers 1 ...] [-- PYTEST_ARGS]``
(the pytest arguments go to every run; ``--workers 1 2`` runs each profile with one judging process
and with two workers, side by side)

Each round runs ``mhaspec certify BACKEND --profile ci`` and then ``--seed SEED`` (the certify
profile: 100 examples a test) as a user would, each a fresh process writing its certificate to a
temporary folder, so both pay the same start-up, collection and sealed backend process. Prints the
wall seconds of each, their ratio and each run's verdict and clause tally: a ratio means something
only where both certificates judged the same clauses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mhaspec import usage



def certify(backend: str, profile_args: list[str], extra: list[str]) -> tuple[float, dict]:
    """Wall seconds of one ``mhaspec certify`` run and its certificate (a fresh folder)."""
    with tempfile.TemporaryDirectory(prefix="mhaspec-certify-cost-") as out:
        command = [sys.executable, "-m", "mhaspec.cli", "certify", backend, *profile_args, "--output-dir", out,
                   *(["--", *extra] if extra else [])]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.monotonic() - started
        written = sorted(Path(out).glob("*.json"))
        if done.returncode not in (0, 1) or not written:
            usage.fail(f"mhaspec certify {backend} {' '.join(profile_args)} failed "
                       f"(exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return seconds, json.loads(written[0].read_text())


def describe(certificate: dict) -> str:
    """``"conforms (97 pass, 2 not-implemented), 660 tests"``."""
    summary = certificate["summary"]
    counts = ", ".join(f"{n} {v}" for v, n in sorted(summary.get("counts", {}).items()))
    return f"{summary['verdict']} ({counts}), {certificate['run']['tests_run']} tests"


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec.bench.certify_cost",
                                  description=__doc__.split("\n")[0])
    parser.add_argument("backend")
    parser.add_argument("--seed", type=int, default=0, help="the certify profile's seed")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1], metavar="N",
                        help="certify's --workers; several: each profile runs with each")
    argv = sys.argv[1:] if argv is None else list(argv)
    # the pytest arguments after "--" (argparse gives a positional nothing there once an option
    # follows the backend)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        usage.checked_backend(args.backend)
    except usage.UsageError as exc:  # one line, not a traceback
        usage.fail(str(exc))
    if min(args.workers) < 1:
        usage.fail(f"--workers must be at least 1, got {min(args.workers)}")
    for i in range(args.rounds):
        for n in args.workers:
            workers = ["--workers", str(n)]
            t_ci, ci = certify(args.backend, ["--profile", "ci", *workers], extra)
            t_full, full = certify(args.backend, ["--seed", str(args.seed), *workers], extra)
            print(f"certify-cost {args.backend} round {i + 1}, {n} worker{'s' * (n > 1)}: ci "
                  f"{t_ci:.1f} s, certify (seed {args.seed}) {t_full:.1f} s, ratio "
                  f"{t_full / t_ci:.2f}; ci: {describe(ci)}; certify: {describe(full)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
