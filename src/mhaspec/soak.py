"""Soak the conformance suite: run it again and again on clean backends with fresh random seeds.

``mhaspec soak [--backend NAME ...] [--seconds S] [--examples N] [--per-test N]
[--jobs J] [-- pytest args]``

Each round is one run of the suite on one backend (``--mhaspec-profile certify``,
``--hypothesis-seed=<random>``, ``--mhaspec-examples <per-test>``, ``--mhaspec-report``) in a
subprocess; the backend with the fewest Hypothesis examples so far goes next, so slow backends get their
share of the budget, and ``--jobs`` rounds run at once, each on a different backend. A backend's
first round runs every dtype at ``--per-test`` examples per test; its later rounds run only the
dtypes still short of the target, with as many examples per test as that takes (from the
examples per dtype its earlier rounds made, at most ``--max-per-test``). ``--resume`` continues
a soak from its ``summary.json``. Shapes come from
the fixed list of shapes by default (``--shapes menu``: compiled variants then compile each once, not
hundreds; values, masks, bias, scales and seeds stay random), or from the free menus of sizes
(``--shapes free``). Rounds continue until the time budget is spent (``--seconds``, env
``MHASPEC_SOAK_SECONDS``, default 3600) or every backend x dtype has made the target number of
Hypothesis examples (``--examples``, env ``MHASPEC_SOAK_EXAMPLES``, default 20000); a backend that has
reached it leaves the later rounds, and a round still running when the budget ends is interrupted
(SIGINT), keeping the results it has so far; Ctrl-C or SIGTERM (``kill``: a soak started in the
background ignores SIGINT) stop the soak the same way. After every round ``results/soak/summary.json`` is
rewritten: per backend x dtype the Hypothesis examples run and the backend calls made (the
report's ``examples`` and ``calls`` per result), tests run, the spec chapters whose tests ran and
failures, and every failure with its seed and message (which carries the reproducer). Exit status
1 when anything failed.

Past one machine: ``--shard I/N --seed BASE`` runs shard I of N, whose generator of round seeds is
seeded with the first 8 bytes of SHA-256(``"mhaspec-soak-shard:BASE:I:N"``)
(:func:`mhaspec.soak_shards.shard_seed`); its summary records ``base_seed``, ``shard`` and
``suite`` (version, git commit, files digest). ``--merge`` adds shards up and refuses shards of
different suites and duplicate shards or seeds of one cell. ``--shards N`` runs shards 1..N (each
``python -m mhaspec.soak --shard I/N`` in a subprocess) one after another, or as tasks of a Dask
cluster with ``--dask LocalCluster|ADDRESS``, and merges them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

from mhaspec import generated, runner, soak_shards, usage
from mhaspec.backends import registered_backends
from mhaspec.conformance import verdicts
from mhaspec.spec import SPEC_VERSION
from mhaspec.spec import load as load_spec

BAD = verdicts.BAD
#: outcomes of a test that ran (the others: capability not claimed, device unavailable)
RAN = ("pass", "deviation", *verdicts.BAD)


def testable_chapters() -> list[str]:
    """The chapters of the running spec that have a testable clause, in spec order."""
    spec = load_spec()
    return [ch.id for ch in spec.chapters
            if any(c.chapter == ch.id and c.testable for c in spec.clauses)]


def chapter_of(clause: str) -> str:
    """``"MASK-9"`` -> ``"MASK"`` (a clause id is its chapter id, a dash and a number)."""
    return clause.rsplit("-", 1)[0]


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = usage.ArgumentParser(prog="mhaspec soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", action="append", default=[], metavar="NAME|module:attr",
                   help="backend to soak (repeatable); default: every registered backend that imports")
    p.add_argument("--seconds", type=usage.positive_seconds,
                   default=float(os.environ.get("MHASPEC_SOAK_SECONDS", 3600)),
                   help="time budget in seconds (env MHASPEC_SOAK_SECONDS, default 3600)")
    p.add_argument("--examples", type=usage.at_least(1),
                   default=int(os.environ.get("MHASPEC_SOAK_EXAMPLES", 20_000)),
                   help="stop once every backend x dtype has run this many Hypothesis examples "
                        "(env MHASPEC_SOAK_EXAMPLES, default 20000)")
    p.add_argument("--per-test", type=usage.at_least(1), default=100, metavar="N",
                   help="Hypothesis examples per test in each round (default 100, the certify "
                        "profile's); more per round spends less of the budget on start-up and "
                        "compilation")
    p.add_argument("--max-per-test", type=usage.at_least(1), default=None, metavar="N",
                   help="cap on the examples per test of a backend's later rounds, which are sized "
                        "from its earlier ones to just reach the target (default 2 x --per-test)")
    p.add_argument("--resume", action="store_true",
                   help="continue the soak whose summary.json is in --output-dir: its counts, "
                        "rounds and failures carry on")
    p.add_argument("--jobs", type=usage.at_least(1), default=1, metavar="J",
                   help="rounds run at the same time, each on a different backend (default 1)")
    p.add_argument("--dtypes", default=None, metavar="D1,D2", help="only these dtypes")
    p.add_argument("--shapes", default="menu", choices=("menu", "free"),
                   help="menu: the fixed list of ci shapes (default); free: every size drawn")
    p.add_argument("--output-dir", default="results/soak", type=pathlib.Path,
                   help="where summary.json and the per-round reports go (default results/soak)")
    p.add_argument("--merge", nargs="+", type=pathlib.Path, default=None, metavar="SUMMARY",
                   help="run nothing: merge the summary.json files of soaks run in parallel (one "
                        "per core or machine) into --output-dir (counts add up)")
    p.add_argument("--one-after-another", action="store_true",
                   help="with --merge: the soaks ran one after another, so their times add up "
                        "(default: side by side, the longest is the soak's time)")
    p.add_argument("--seed", type=int, default=None, help="seed of the generator of per-round "
                   "Hypothesis seeds; with --shard/--shards, the base seed (default: random)")
    shards = p.add_argument_group("shards", "a soak split over processes or machines "
                                  "(mhaspec.soak_shards): shard I of N seeds its generator with "
                                  "SHA-256 of --seed, I and N, and --merge adds shards up")
    shards.add_argument("--shard", type=soak_shards.parse_shard, metavar="I/N",
                        help="run shard I of N")
    shards.add_argument("--shards", type=usage.at_least(1), metavar="N",
                        help="run shards 1..N, one after another or on --dask, and merge them")
    shards.add_argument("--dask", metavar="LocalCluster|ADDRESS", help="with --shards: run each "
                        "shard as a task of this Dask cluster (mhaspec[dask])")
    return p.parse_args(argv), extra


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_on_sigterm() -> None:
    """SIGTERM (``kill PID``, a cancelled CI job) stops the soak as Ctrl-C does: no new round, the
    running rounds interrupted with their results kept, the summary written. A soak started in
    the background (``nohup``, ``&`` in a script) ignores SIGINT, so this is how it is stopped."""
    if os.name == "posix" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt


class _Round:
    """One running round: the suite on one backend in a subprocess."""

    def __init__(self, args, index: int, backend: str, seed: int, extra: list[str],
                 per_test: int, dtypes: str | None):
        self.index, self.backend, self.seed = index, backend, seed
        self.per_test, self.dtypes = per_test, dtypes
        self.report = args.output_dir / f"round-{index:03d}.json"
        self.report.unlink(missing_ok=True)
        cmd = runner.command(runner.suite_args(
            backends=[backend], profile="certify", seed=seed, report=self.report.resolve(),
            shapes=args.shapes, examples=per_test, dtypes=dtypes or None, extra=extra))
        # own cwd: the Hypothesis example database of the soak stays under the output directory
        work = args.output_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        self.log = (args.output_dir / f"{self.report.stem}.log").open("w", encoding="utf-8")
        # SIGINT back to its default in the round, so pytest turns it into KeyboardInterrupt and
        # writes its report even where the soak itself was started with SIGINT ignored (nohup, &)
        self.proc = subprocess.Popen(cmd, cwd=work, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=_default_sigint if os.name == "posix" else None)
        self.interrupted = False

    def interrupt(self, grace: float = 0.0) -> None:
        """Stop at the deadline: pytest still writes the report of what has run. ``grace``:
        seconds to wait first (after a Ctrl-C the terminal has already sent it SIGINT)."""
        self.interrupted = True
        try:
            self.proc.wait(timeout=grace) if grace else None
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def result(self) -> dict:
        self.log.close()
        results = runner.load_results(self.report)
        return {"seed": self.seed, "returncode": self.proc.returncode, "per_test": self.per_test,
                "dtypes": self.dtypes, "interrupted": self.interrupted, "results": results}


def _rates(results: list[dict], per_test: int) -> dict[str, float]:
    """Examples per dtype of one round, per unit of examples-per-test (``backend/dtype`` keys)."""
    examples: dict[str, int] = {}
    for r in results:
        key = f"{r['backend']}/{r['dtype']}"
        examples[key] = examples.get(key, 0) + int(r.get("examples", 0))
    return {key: n / per_test for key, n in examples.items() if n}


def _accumulate(summary: dict, rnd: dict, index: int, backend: str) -> None:
    cells = summary["by_backend_dtype"]
    if not rnd["interrupted"] and rnd.get("per_test"):
        summary.setdefault("rates", {}).update(_rates(rnd["results"], rnd["per_test"]))
    for r in rnd["results"]:
        key = f"{r['backend']}/{r['dtype']}"
        cell = cells.setdefault(key, {"backend": r["backend"], "dtype": r["dtype"], "examples": 0,
                                      "calls": 0,
                                      "tests": 0, "failures": 0})
        cell["examples"] += int(r.get("examples", 0))
        cell["calls"] += int(r.get("calls", 0))
        cell["tests"] += r["outcome"] != "unavailable"
        if r["outcome"] in RAN:
            cell["chapters"] = sorted({*cell.get("chapters", ()),
                                       *(chapter_of(c) for c in r["clauses"])})
        if r["outcome"] in BAD:
            cell["failures"] += 1
            summary["failures"].append({
                "round": index, "seed": rnd["seed"], "backend": r["backend"], "device": r["device"],
                "dtype": r["dtype"], "test": r["test"], "clauses": r["clauses"],
                "outcome": r["outcome"], "message": r.get("message", "")})
    summary["rounds"].append({"round": index, "backend": backend, "seed": rnd["seed"],
                              "per_test": rnd.get("per_test"), "dtypes": rnd.get("dtypes"),
                              "returncode": rnd["returncode"],
                              "interrupted": rnd["interrupted"], "results": len(rnd["results"])})


def _examples(summary: dict, backend: str) -> int:
    """The fewest Hypothesis examples of any dtype of ``backend`` so far (0 before its first
    round)."""
    cells = [c["examples"] for c in summary["by_backend_dtype"].values() if c["backend"] == backend]
    return min(cells, default=0)


def _table(summary: dict) -> str:
    rows = [("backend", "dtype", "examples", "calls", "tests", "failures")]
    rows += [(c["backend"], c["dtype"], str(c.get("examples", "")), str(c["calls"]), str(c["tests"]),
              str(c["failures"]))
             for c in sorted(summary["by_backend_dtype"].values(),
                             key=lambda c: (c["backend"], c["dtype"]))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths))) for r in rows)


def markdown(summary: dict) -> str:
    """The soak's counts as a Markdown table (for docs/generated/soak.md)."""
    cells = sorted(summary["by_backend_dtype"].values(), key=lambda c: (c["backend"], c["dtype"]))
    total = sum(c["calls"] for c in cells)
    examples = sum(c.get("examples", 0) for c in cells)
    target = _target(summary)
    lower = {f"{c['target']:,} for {c['backend']}/{c['dtype']}" for c in cells
             if c.get("target", target) < target}
    streams = summary.get("merged_from", 1)
    how = " soaks one after another" if summary.get("one_after_another") else " processes side by side"
    started = f" of {summary['started']}" if summary.get("started") else ""
    jobs = summary.get("jobs", 1)
    per_test = summary.get("examples_per_test", 100)
    per_test = f"{min(per_test)} to {max(per_test)}" if isinstance(per_test, list) else per_test
    version = summary.get("spec_version")
    lines = ([generated.marker(version)] if version else []) + [
             f"Soak{started} ({summary['elapsed_s']:.0f} s"
             + (f" in {streams}{how}" if streams > 1 else "")
             + (f", {jobs} rounds at a time" if jobs > 1 else "") + ", "
             f"{len(summary['rounds'])} rounds, {per_test} "
             f"examples per test in a backend's first round and later ones sized to reach the "
             f"target, profile {summary['profile']}, shapes "
             f"{summary.get('shapes', 'free')}, target {target:,} examples per "
             f"backend x dtype" + (f" ({', '.join(sorted(lower))})" if lower else "") + "): "
             f"**{examples:,} Hypothesis examples, {total:,} backend calls, "
             f"{len(summary['failures'])} failures**."
             + (f" Suite: {soak_shards.suite_text(summary['suite'])}." if summary.get("suite")
                else ""),
             ""]
    chapters = summary.get("chapters")
    if chapters:
        lines += [f"Chapters of spec {version} with a testable clause: {len(chapters)} "
                  f"({', '.join(chapters)}). *Chapters run*: those with a test that ran in the "
                  f"cell (a chapter whose capability the backend does not claim, or whose tests are "
                  f"all marked for other dtypes, runs none there).", ""]
    lines += ["| backend | dtype | Hypothesis examples | backend calls | tests run | failures |"
              + (" chapters run |" if chapters else ""),
              "|---|---|---:|---:|---:|---:|" + ("---|" if chapters else "")]
    lines += [f"| {c['backend']} | {c['dtype']} | {c.get('examples', 0):,} | {c['calls']:,} | "
              f"{c['tests']:,} | {c['failures']} |"
              + (f" {_chapters_run(c.get('chapters', []), chapters)} |" if chapters else "")
              for c in cells]
    short = [c for c in cells if c.get("examples", 0) < c.get("target", target)]
    if short:
        lines += ["", f"{len(short)} backend x dtype cells stopped below the target when the time "
                      "budget ran out: " + ", ".join(f"{c['backend']}/{c['dtype']}" for c in short)
                  + "."]
    if summary["failures"]:
        lines += ["", "Failures (each with its reproducer in summary.json):", ""]
    for f in summary["failures"]:
        lines += [f"- round {f['round']}, seed {f['seed']}: {f['backend']} {f['dtype']} "
                  f"`{f['test']}` ({', '.join(f['clauses'])})"]
    if summary.get("errors"):
        lines += ["", "Rounds that ended without a report (crashes):", ""]
        lines += [f"- {e}" for e in summary["errors"]]
    return "\n".join(lines) + "\n"


def _target(summary: dict) -> int:
    """The examples per backend x dtype a soak aimed at (older summaries counted calls)."""
    return summary.get("target_examples", summary.get("target_calls"))


def _chapters_run(ran: list[str], chapters: list[str]) -> str:
    """``"17 of 17"``, or with the chapters that did not run: ``"15 of 17 (not SOFTCAP, LSE)"``."""
    missing = [ch for ch in chapters if ch not in ran]
    said = f"{len(chapters) - len(missing)} of {len(chapters)}"
    return f"{said} (not {', '.join(missing)})" if missing else said


def _as_list(value) -> list:
    """``value`` as a list (a merged summary's fields list what single soaks hold once)."""
    return value if isinstance(value, list) else [value]


def merge(summaries: list[dict], *, one_after_another: bool = False,
          names: list[str] | None = None) -> dict:
    """One summary from several soaks: examples, calls, tests and failures add up per cell, and each
    cell keeps the largest target of the soaks that ran it. The elapsed time is the longest when
    they ran side by side, the sum when ``one_after_another``. Soaks of different suites, or two
    holding the same shard or round seed of a cell, are refused (:func:`soak_shards.check_mergeable`;
    ``names``: the files, for its message)."""
    soak_shards.check_mergeable(summaries, names or [f"summary {k + 1}"
                                                     for k in range(len(summaries))])
    times = [s.get("elapsed_s", 0.0) for s in summaries]
    per_test = sorted({n for s in summaries  # a merged summary lists its soaks' values
                       for n in _as_list(s.get("examples_per_test", 100))})
    out = {**summaries[0], "merged_from": len(summaries), "rounds": [], "failures": [],
           "by_backend_dtype": {}, "command": [s["command"] for s in summaries],
           "backends": sorted({b for s in summaries for b in
                               _as_list(s["backends"])}),
           "elapsed_s": sum(times) if one_after_another else max(times),
           "one_after_another": one_after_another,
           "examples_per_test": per_test[0] if len(per_test) == 1 else per_test,
           "target_examples": max(_target(s) for s in summaries)}
    out["errors"] = [e for s in summaries for e in s.get("errors", [])]
    out.pop("shard", None)
    out.pop("returncode", None)
    held = sorted({k for s in summaries for k in soak_shards.shards_of(s)})
    out["shards"] = [{"base_seed": base, "shard": [i, n]} for base, i, n in held]
    for s in summaries:
        out["rounds"] += s["rounds"]
        out["failures"] += s["failures"]
        for key, c in s["by_backend_dtype"].items():
            cell = out["by_backend_dtype"].setdefault(
                key, {**c, "examples": 0, "calls": 0, "tests": 0, "failures": 0, "target": 0})
            for field in ("examples", "calls", "tests", "failures"):
                cell[field] += c.get(field, 0)
            cell["target"] = max(cell["target"], c.get("target", _target(s)))
            if "chapters" in c:
                cell["chapters"] = sorted({*cell.get("chapters", ()), *c["chapters"]})
    return out


def _plan(summary: dict, backend: str, args) -> tuple[int, str | None]:
    """Examples per test and dtypes of ``backend``'s next round. The first round runs every dtype
    at ``--per-test``; later rounds run only the dtypes still short of the target, sized from the
    examples per dtype that earlier rounds made (10% margin), between 10 and ``--max-per-test``."""
    cells = [c for c in summary["by_backend_dtype"].values() if c["backend"] == backend]
    short = [c for c in cells if c["examples"] < args.examples]
    rates = summary.get("rates", {})
    if not short or any(f"{backend}/{c['dtype']}" not in rates for c in short):
        return args.per_test, args.dtypes
    need = max((args.examples - c["examples"]) / rates[f"{backend}/{c['dtype']}"] for c in short)
    cap = args.max_per_test or 2 * args.per_test
    return min(cap, max(10, math.ceil(1.1 * need))), ",".join(sorted(c["dtype"] for c in short))


def _record(summary: dict, rnd: _Round, remaining: list[str], target: int) -> None:
    """Add a finished round to the summary; drop its backend from ``remaining`` when it has
    reached the target, wrote no report, or ran nothing (not importable here)."""
    res = rnd.result()
    name = rnd.backend
    if not res["results"] and not res["interrupted"]:
        summary.setdefault("errors", []).append(
            f"round {rnd.index} ({name}) wrote no report (exit {res['returncode']}); see "
            f"{rnd.report.with_suffix('.log')}")
        print(summary["errors"][-1], file=sys.stderr)
        remaining.remove(name)
        return
    _accumulate(summary, res, rnd.index, name)
    if not res["interrupted"] and _examples(summary, name) == 0:
        summary.setdefault("unavailable", []).append(name)
        remaining.remove(name)
    elif _examples(summary, name) >= target:
        remaining.remove(name)


def _shard_args(args, extra: list[str]) -> list[str]:
    """The soak options every shard of ``--shards`` runs with (its shard, seed and output folder
    are added per shard)."""
    out = [arg for b in args.backend for arg in ("--backend", b)]
    out += ["--seconds", str(args.seconds), "--examples", str(args.examples),
            "--per-test", str(args.per_test), "--jobs", str(args.jobs), "--shapes", args.shapes]
    out += ["--max-per-test", str(args.max_per_test)] if args.max_per_test else []
    out += ["--dtypes", args.dtypes] if args.dtypes else []
    return out + (["--", *extra] if extra else [])


def main(argv: list[str] | None = None) -> int:
    args, extra = _parse(sys.argv[1:] if argv is None else argv)
    for ref in args.backend:
        usage.checked_backend(ref)  # a backend that cannot load is one line before anything runs
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.dask and not args.shards:
        raise usage.UsageError("--dask: needs --shards N (the shards it runs)")
    if args.shards and (args.shard or args.merge or args.resume):
        raise usage.UsageError("--shards: runs and merges every shard; not with --shard, "
                               "--merge or --resume")
    base_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 63)
    if args.merge or args.shards:
        if args.shards:
            try:
                summaries = soak_shards.run_shards(args.shards, base_seed, _shard_args(args, extra),
                                                   args.output_dir / "shards", args.dask)
            except RuntimeError as exc:  # a shard that crashed before writing its summary
                print(f"soak: {usage.one_line(exc)}", file=sys.stderr)
                return 1
            names = [f"shard {i}/{args.shards}" for i in range(1, args.shards + 1)]
            one_after_another = args.dask is None
        else:
            summaries = [usage.read_json(path, "soak summary") for path in args.merge]
            names = [str(path) for path in args.merge]
            one_after_another = args.one_after_another
        try:
            summary = merge(summaries, one_after_another=one_after_another, names=names)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise usage.UsageError(f"--merge: not soak summaries (summary.json of mhaspec soak): "
                                   f"{type(exc).__name__}: {usage.one_line(exc)}") from None
        if args.shards:
            summary["dask"] = args.dask
        (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=1), "utf-8")
        (args.output_dir / "summary.md").write_text(markdown(summary), "utf-8")
        print(_table(summary))
        return 1 if summary["failures"] else 0
    _interrupt_on_sigterm()
    rng = random.Random(soak_shards.shard_seed(base_seed, *args.shard) if args.shard else base_seed)
    start = time.monotonic()
    deadline = start + args.seconds
    out = args.output_dir / "summary.json"
    if args.resume and out.exists():
        summary = json.loads(out.read_text("utf-8"))
        summary.setdefault("resumed", []).append(
            {"at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": sys.argv[1:]})
        start -= summary.get("elapsed_s", 0.0)  # elapsed time carries on
        deadline = time.monotonic() + args.seconds
        for rnd in summary["rounds"]:  # rates of rounds recorded before rates were kept
            report = args.output_dir / f"round-{rnd['round']:03d}.json"
            if not rnd.get("interrupted") and report.exists():
                per_test = rnd.get("per_test") or summary.get("examples_per_test", 100)
                rates = _rates(runner.load_results(report), per_test)
                summary.setdefault("rates", {}).update({k: v for k, v in rates.items()
                                                        if k not in summary["rates"]})
    else:
        summary = {"command": ["mhaspec", "soak", *(sys.argv[1:] if argv is None else argv)],
                   "backends": args.backend or "registered", "profile": "certify",
                   "shapes": args.shapes, "seconds_budget": args.seconds,
                   "target_examples": args.examples, "examples_per_test": args.per_test,
                   "jobs": args.jobs, "rounds": [],
                   "by_backend_dtype": {}, "failures": [],
                   "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "spec_version": SPEC_VERSION, "chapters": testable_chapters(),
                   "base_seed": base_seed, "shard": list(args.shard) if args.shard else None,
                   "suite": soak_shards.suite_identity()}
    print(f"soak: suite {soak_shards.suite_text(summary.get('suite'))}", flush=True)
    index = max((r["round"] for r in summary["rounds"]), default=0)
    remaining = [b for b in (list(args.backend) or sorted(registered_backends()))
                 if b not in summary.get("unavailable", []) and _examples(summary, b) < args.examples]
    running: list[_Round] = []
    while True:
        idle = [b for b in remaining if b not in {r.backend for r in running}]
        while len(running) < args.jobs and idle and time.monotonic() < deadline - 1:
            name = min(idle, key=lambda b: _examples(summary, b))
            idle.remove(name)
            index += 1
            seed = rng.randrange(2 ** 32)
            per_test, dtypes = _plan(summary, name, args)
            print(f"soak round {index}: {name} --hypothesis-seed={seed} --mhaspec-examples "
                  f"{per_test}" + (f" --mhaspec-dtypes {dtypes}" if dtypes else ""), flush=True)
            running.append(_Round(args, index, name, seed, extra, per_test, dtypes))
        if not running:
            break
        try:
            while not any(r.proc.poll() is not None for r in running):
                if time.monotonic() >= deadline:
                    for r in running:
                        r.interrupt()
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C: no new rounds, keep what the running ones have done
            print("\nsoak: interrupted; collecting the running rounds' results", file=sys.stderr)
            summary["interrupted"] = True
            deadline = time.monotonic()
            for r in running:
                r.interrupt(grace=10.0)
        for rnd in [r for r in running if r.proc.poll() is not None]:
            running.remove(rnd)
            _record(summary, rnd, remaining, args.examples)
        summary["elapsed_s"] = round(time.monotonic() - start, 1)
        out.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    summary["elapsed_s"] = round(time.monotonic() - start, 1)
    out.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (args.output_dir / "summary.md").write_text(markdown(summary), encoding="utf-8")
    print(f"\nsoak: {len(summary['rounds'])} round(s) in {summary['elapsed_s']:.0f} s")
    print(_table(summary))
    for f in summary["failures"]:
        print(f"\nFAILURE round {f['round']} seed {f['seed']}: {f['backend']} {f['dtype']} "
              f"{f['test']} {f['clauses']} ({f['outcome']})\n{f['message']}")
    print(f"\nsoak: summary written to {out}")
    return 1 if summary["failures"] or summary.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
