"""``mhaspec matrix``: the conformance matrix of every registered backend.

Runs the conformance suite (ci profile) once over every registered backend (in-process, through
:mod:`mhaspec.runner`; the results are also kept in ``results/matrix/report.json``), then renders
``docs/generated/matrix.md`` (included by ``docs/matrix.md``):

* one row per implementation with its framework version, the devices and dtypes it ran on, its
  verdict (:func:`mhaspec.conformance.verdicts.overall_verdict`, as ``mhaspec certify``) and the
  seconds its tests took;
* one row per implementation, one column per chapter of the spec; a cell is *pass*, *deviation*
  (with the backend's declared one-line behaviour), *not implemented* (capability not claimed) or
  *fail* (with the failing clauses);
* a pairwise agreement table: the largest absolute difference between the outputs of every two
  implementations on a few fixed inputs, in float64 and float32.

Clause links are relative to ``docs/`` (``spec/index.md#MASK-9``), where the page is included.
Options: ``--dtypes float64,float32`` (a shorter run; the page says so), ``--report FILE`` (render
an existing report instead of running; without the not-run records a rendered report cannot tell
"incomplete"), ``--out``, ``--profile``; other arguments after ``--`` go to
pytest.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import sys
from collections import defaultdict

import numpy as np

from mhaspec import conventions, generated, runner, usage
from mhaspec.backends import loadable, registered_backends
from mhaspec.conformance import harness, verdicts
from mhaspec.conformance.strategies import CaseSpec, build_case
from mhaspec.spec import load as load_spec

DEFAULT_OUT = pathlib.Path("docs/generated/matrix.md")
DEFAULT_REPORT = pathlib.Path("results/matrix/report.json")

#: Fixed inputs of the agreement table: self-attention, cross-attention with masks, causal.
AGREEMENT_CASES = {
    "self, h=2, L=5": CaseSpec(batch=2, heads=2, len_q=5, len_k=5, d_k=4, d_v=4, d_model=8, k_dim=8,
                               v_dim=8, d_out=8, self_attention=True, seed=101),
    "mask + key padding, h=2, L_q=5, L_k=8": CaseSpec(
        batch=2, heads=2, len_q=5, len_k=8, d_k=4, d_v=4, d_model=8, k_dim=8, v_dim=8, d_out=8,
        mask_shape=(2, 1, 5, 8), key_padding=True, seed=102),
    "causal top-left, h=3, L=8": CaseSpec(batch=1, heads=3, len_q=8, len_k=8, d_k=4, d_v=4,
                                          d_model=12, k_dim=12, v_dim=12, d_out=12,
                                          self_attention=True, causal="top_left", seed=103),
}

CELL = {"pass": "pass", "deviation": "deviation", "not-implemented": "not implemented",
        "fail": "**fail**", "stale-deviation": "**fail** (stale deviation)",
        "unavailable": "unavailable"}


def link(clause: str) -> str:
    return f"[{clause}](spec/index.md#{clause})"


def _chapter_cell(outcomes: dict[str, str], deviations: dict[str, str]) -> str:
    """One cell from clause -> worst outcome for the clauses of one chapter."""
    ran = {c: o for c, o in outcomes.items() if o != "unavailable"}
    if not ran:
        return "unavailable" if outcomes else ""
    worst = verdicts.chapter_verdict(ran)
    if worst in verdicts.BAD:
        bad = [c for c, o in ran.items() if o == worst]
        return CELL[worst] + ": " + ", ".join(link(c) for c in bad)
    parts = []
    devs = [c for c, o in ran.items() if o == "deviation"]
    if devs:
        parts.append("deviation: " + "; ".join(f"{link(c)}: {deviations.get(c, 'declared')}"
                                               for c in devs))
    passed = [c for c, o in ran.items() if o == "pass"]
    missing = [c for c, o in ran.items() if o == "not-implemented"]
    if passed:
        parts.insert(0, "pass" if not devs and not missing else
                     "pass: " + ", ".join(link(c) for c in passed))
    if missing:
        parts.append("not implemented" + ("" if not passed and not devs else
                                          ": " + ", ".join(link(c) for c in missing)))
    return "<br>".join(parts)


def agreement(backends: list, dtype: str) -> tuple[list[str], np.ndarray]:
    """Max abs difference of multi-head attention outputs between every two backends (NaN where
    a backend cannot run a case; the worst over :data:`AGREEMENT_CASES`)."""
    names, outs = [], []
    for be in backends:
        if "mha" not in be.capabilities:
            continue
        impl = harness.Cell(be, "cpu", dtype)
        results = []
        for spec in AGREEMENT_CASES.values():
            try:
                got = harness.run(impl, "mha", build_case(spec))
                results.append(np.asarray(got.out, dtype=np.float64))
            except (NotImplementedError, ValueError):
                results.append(None)
        names.append(be.name)
        outs.append(results)
    n = len(names)
    table = np.full((n, n), np.nan)
    for i in range(n):
        for j in range(n):
            diffs = [float(np.max(np.abs(a - b))) for a, b in zip(outs[i], outs[j])
                     if a is not None and b is not None]
            if diffs:
                table[i, j] = max(diffs)
    return names, table


def _conventions_section(loaded: list) -> list[str]:
    """Where a native op differs from the spec by convention, the adapter translates; this run
    confirms each translation is needed (the untranslated call does not conform) and right."""
    rows = [r for be in loaded for r in conventions.confirm(be)]
    if not rows:
        return []
    lines = ["## Conventions the adapters translate", "",
             "These native conventions differ from the spec; the adapters translate them, so they "
             "are no deviation. Each was confirmed in this run: the adapter as shipped agrees "
             "with the oracle, and the same call with that one translation switched off "
             "(`adapter.untranslated(key)`, on a case that exercises it, float32) does not.", "",
             "| implementation | clause | native convention | without the translation | as shipped |",
             "|---|---|---|---|---|"]
    for r in rows:
        mark = "" if r.confirmed else " **(not confirmed)**"
        lines.append(f"| `{r.adapter}` | [{r.clause}](spec/index.md#{r.clause}) | {r.explanation} "
                     f"| {r.untranslated}{mark} | {r.translated} |")
    return lines + [""]


def render(results: list[dict], backends: dict, dtypes: str | None, profile: str,
           not_run: list[dict] = (), left_out: list[str] = ()) -> str:
    """The matrix page from the run's results (and its not-run records, for the verdicts);
    ``left_out``: registered backends with no result in this run (named on the page)."""
    spec = load_spec()
    chapters = [ch for ch in spec.chapters if any(c.chapter == ch.id and c.testable
                                                  for c in spec.clauses)]
    clause_chapter = {c.id: c.chapter for c in spec.clauses}
    table = verdicts.summarize(results)
    worst = {key: entry["outcome"] for key, entry in table.items()}
    combos: dict[str, set] = defaultdict(set)
    seconds: dict[str, float] = defaultdict(float)
    for r in results:
        seconds[r["backend"]] += r.get("duration", 0.0)
        if r["outcome"] != "unavailable":
            combos[r["backend"]].add((r["device"], r["dtype"]))
    names = sorted({b for b, _ in worst})
    claimed = {n: {d: list(be.dtypes(d)) for d, why in be.devices().items() if why is None}
               for n, be in backends.items()}
    report = verdicts.backend_report(results, spec, claimed, list(not_run))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    scope = (f"dtypes {dtypes.replace(',', ', ')} only (a shorter run: float16 and bfloat16 were "
             f"not run)" if dtypes else "every dtype each backend claims")
    lines = [
        generated.marker(spec.version), f"# Conformance matrix: {spec.name} {spec.version}", "",
        f"Generated by `mhaspec matrix` (`nox -s matrix`, or rendered from the results of "
        f"`nox -s conformance`) on {now}: the "
        f"conformance suite, Hypothesis profile `{profile}`, {scope}, on {platform.machine()} "
        f"{platform.system()} with Python {platform.python_version()}. Devices without hardware "
        f"on this machine are reported unavailable and not shown.", "",
        "A cell sums up the clauses of one chapter: **pass**, **deviation** (the backend declares "
        "it does not follow the clause; the suite confirms that it really deviates; the declared "
        "behaviour is quoted), **not implemented** (the backend does not claim the capability "
        "the clause needs) or **fail**. A clause is as bad as its worst run over devices and "
        "dtypes.", ""]
    if left_out:
        lines += [f"**Not in this run**: {len(left_out)} registered "
                  f"backend{'s' if len(left_out) > 1 else ''} (not chosen with "
                  f"`--backend`, or their framework not installed where it ran): "
                  + ", ".join(f"`{n}`" for n in left_out) + ".", ""]
    lines += ["## Implementations", "",
              "Verdict as `mhaspec certify` gives it; test time: the seconds its tests took in "
              "this run (setup, call and teardown, summed).", "",
              "| implementation | framework | version | ran on | verdict | test time |",
              "|---|---|---|---|---|---|"]
    for n in names:
        be = backends.get(n)
        fw = getattr(be, "framework", "?")
        try:
            ver = be.framework_version() if be is not None else "?"
        except Exception:  # noqa: BLE001 - a version is informative only
            ver = "?"
        ran = ", ".join(f"{d}/{t}" for d, t in sorted(combos[n])) or "-"
        verdict = report[n]["verdict"] if n in report else verdicts.NOT_CHECKED
        lines.append(f"| `{n}` | {fw} | {ver} | {ran} | {verdict} | {seconds[n]:.1f} s |")
    notes = [f"- `{n}`: {note}" for n in names if n in report
             for note in verdicts.backend_notes(report[n]["clauses"])]
    lines += ["", *notes] if notes else []
    lines += ["", "## Results by chapter", "",
              "| implementation | " + " | ".join(f"[{ch.id}](spec/index.md#{ch.id})"
                                                 for ch in chapters) + " |",
              "|---|" + "---|" * len(chapters)]
    for n in names:
        devs = dict(getattr(backends.get(n), "deviations", {}) or {})
        cells = []
        for ch in chapters:
            outcomes = {c: o for (b, c), o in worst.items() if b == n and clause_chapter.get(c) == ch.id}
            cells.append(_chapter_cell(outcomes, devs))
        lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
    lines += ["", "Clauses per outcome: " + "; ".join(
        f"`{n}` " + ", ".join(f"{k} {o}" for o, k in verdicts.outcome_counts(table, n).items())
        for n in names) + ".", ""]
    lines += _conventions_section([backends[n] for n in names if n in backends])
    lines += ["## Pairwise agreement", "",
              "Largest absolute difference between the multi-head attention outputs of two "
              "implementations on the same fixed inputs (the worst of: "
              + "; ".join(AGREEMENT_CASES) + "), computed on the CPU. `-`: one of them cannot run "
              "these inputs (e.g. an SDPA-only kernel); fully masked rows do not occur in these "
              "inputs.", ""]
    loaded = [backends[n] for n in names if n in backends]
    for dtype in ("float64", "float32"):
        if dtypes and dtype not in dtypes.split(","):
            continue
        bnames, table = agreement(loaded, dtype)
        lines += [f"### {dtype}", "", "| | " + " | ".join(f"`{b}`" for b in bnames) + " |",
                  "|---|" + "---|" * len(bnames)]
        for i, b in enumerate(bnames):
            row = ["-" if np.isnan(v) else ("0" if v == 0 else f"{v:.1e}") for v in table[i]]
            lines.append(f"| `{b}` | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec matrix",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"Markdown page to write (default {DEFAULT_OUT})")
    parser.add_argument("--report", type=pathlib.Path, default=None,
                        help="render this existing --mhaspec-report JSON instead of running")
    parser.add_argument("--dtypes", default=None, help="only these dtypes, e.g. float64,float32")
    parser.add_argument("--profile", default="ci", choices=["dev", "ci", "certify", "triage"],
                        help="Hypothesis profile of the run (default ci: the fixed derandomized "
                             "examples)")
    parser.add_argument("--backend", action="append", default=[],
                        help="only these backends (default: every registered backend)")
    args, extra = parser.parse_known_args(argv)
    found = loadable(args.backend or None)
    backends = {be.name: be for be in found.backends.values()}
    refs = list(found.backends)
    not_run: list[dict] = []
    if args.report is not None:
        results = runner.read_report(args.report)
    else:
        suite = runner.suite_args(profile=args.profile, dtypes=args.dtypes, backends=refs,
                                  extra=[a for a in extra if a != "--"])
        print("running: pytest", " ".join(suite), flush=True)
        try:
            run = runner.run_in_process(suite, backends=list(backends.values()),
                                        refs=dict(zip(backends, refs)), only=False)
        except runner.RunError as exc:
            print(f"mhaspec: error: {exc}", file=sys.stderr)
            return 2
        results, not_run = run.collector.results, run.collector.not_run()
        DEFAULT_REPORT.parent.mkdir(parents=True, exist_ok=True)
        DEFAULT_REPORT.write_text(json.dumps(results, indent=1), encoding="utf-8")
    for ref, why in found.failures.items():  # after the arguments and the run were accepted:
        print(f"skipped {ref}: {why}", file=sys.stderr)  # a usage error stays one line
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ran = {r["backend"] for r in results}
    left_out = [name for name in sorted(registered_backends()) if name not in ran]
    args.out.write_text(render(results, backends, args.dtypes, args.profile, not_run, left_out),
                        encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
