"""Audit a certificate: re-run a sample of every clause it lists and report verdicts that differ.

``mhaspec audit CERT [--seed S] [--examples N] [--backend REF]``

The auditor picks the seed (``--seed``, default random and printed). The suite runs once, in a
subprocess (:mod:`mhaspec.runner`), on the backend the certificate names (its ``backend.ref``,
or ``--backend``: a backend of the same name; a framework version other than the certificate's
is printed as a note), with the ``certify`` profile, ``--hypothesis-seed=S``, ``N`` Hypothesis examples
per test (default 5) and the certificate's own selection (dtypes, ``-k``, ``-m``, deselected
tests). Each clause's verdict is then computed from these results as certify computes it
(:func:`mhaspec.conformance.verdicts.clause_verdicts`) and compared with the certificate's: one
table lists every clause whose verdict differs, and the exit status is 1 when any does (0 when
every listed clause reproduces). A sample can miss a rare failure the certificate found: that is
reported as a difference too, since the audit cannot reproduce it with its seed.
"""

from __future__ import annotations

import pathlib
import random
import sys

from mhaspec import certificate, runner, usage
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

#: the largest certificate file read (bytes)
MAX_BYTES = 64 * 1024 * 1024


def _parse(argv: list[str]):
    p = usage.ArgumentParser(prog="mhaspec audit", description=__doc__.split("\n\n")[0])
    p.add_argument("certificate", type=pathlib.Path, metavar="CERT", help="the certificate (JSON)")
    p.add_argument("--seed", type=int, default=None,
                   help="Hypothesis seed of the re-run, the auditor's choice (default: random)")
    p.add_argument("--examples", type=usage.at_least(1), default=5, metavar="N",
                   help="Hypothesis examples per test (default 5)")
    p.add_argument("--backend", default=None, metavar="NAME|module:attr",
                   help="the backend to run (default: the certificate's backend.ref)")
    p.add_argument("--timeout", type=usage.positive_seconds, default=3600.0,
                   help="seconds the re-run may take (default 3600)")
    return p.parse_args(argv)


def read_certificate(path: pathlib.Path) -> dict:
    """The certificate in ``path``, schema and digest checked (a :class:`usage.UsageError` naming
    the file otherwise)."""
    data = usage.read_bounded(path, MAX_BYTES, "certificate")
    try:
        return certificate.verify(certificate.loads(data))
    except certificate.CertificateError as exc:
        raise usage.UsageError(f"certificate {usage.printable(path)}: "
                               f"{usage.one_line(exc)}") from None


def suite_args(cert: dict, ref: str, seed: int, examples: int) -> list[str]:
    """The pytest arguments of the audit's run: the certificate's selection, the auditor's seed."""
    sel = cert["run"].get("selection") or {}
    extra = (["-k", sel["keyword"]] if sel.get("keyword") else []) \
        + (["-m", sel["markers"]] if sel.get("markers") else []) \
        + [a for test in sel.get("deselect") or [] for a in ("--deselect", test)]
    return runner.suite_args(backends=[ref], profile="certify", seed=seed, examples=examples,
                             dtypes=",".join(sel["dtypes"]) if sel.get("dtypes") else None,
                             extra=["-p", "no:xdist", *extra])


def rerun(cert: dict, *, seed: int, examples: int, ref: str | None = None,
          timeout: float | None = None) -> list[dict]:
    """The results of the audit's run of the certificate's backend (its tests' records)."""
    run = runner.run_subprocess(suite_args(cert, ref or cert["backend"]["ref"], seed, examples),
                                timeout=timeout)
    results = [r for r in run.results if r["backend"] == cert["backend"]["name"]]
    if not results:
        tail = usage.one_line((run.stdout + run.stderr)[-400:])
        raise usage.UsageError(f"audit: the re-run of {cert['backend']['name']} ran no test "
                               f"(pytest exit {run.returncode}): {tail}")
    return results


def differences(cert: dict, results: list[dict]) -> list[tuple[str, str, str, int]]:
    """(clause, certified verdict, audited verdict, tests run) for every clause the certificate
    lists whose verdict in ``results`` differs."""
    audited = {c["id"]: c for c in verdicts.clause_verdicts(results, load_spec(), {}, [])}
    out = []
    for clause in cert["clauses"]:
        mine = audited.get(clause["id"], {"verdict": "not-run", "runs": 0})
        if mine["verdict"] != clause["verdict"]:
            out.append((clause["id"], clause["verdict"], mine["verdict"], mine["runs"]))
    return out


def why(rows: list[tuple[str, str, str, int]], results: list[dict]) -> list[str]:
    """For every differing clause the audit failed, the first failing test of that clause and the
    first line of its failure (what an auditor needs to tell a backend's failure from the run's)."""
    lines = []
    for clause, _, audited, _ in rows:
        failed = next((r for r in results if clause in r["clauses"]
                       and r["outcome"] in ("fail", "error")), None)
        if audited == "fail" and failed is not None:
            first = next((line.strip() for line in str(failed.get("message", "")).splitlines()
                          if line.strip()), "no message")
            lines.append(f"{clause}: {usage.printable(failed['test'])}: "
                         f"{usage.printable(first, 300)}")
    return lines


def table(rows: list[tuple[str, str, str, int]]) -> str:
    """The differing clauses as a plain-text table."""
    head = ("clause", "certificate", "audit", "tests run")
    lines = [head, *((c, a, b, str(n)) for c, a, b, n in rows)]
    widths = [max(len(r[i]) for r in lines) for i in range(4)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    cert = read_certificate(args.certificate)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    name = cert["backend"]["name"]
    ref = args.backend or cert["backend"]["ref"]
    backend = usage.checked_backend(ref)  # one line before anything runs when it cannot load
    if backend.name != name:
        raise usage.UsageError(f"--backend: {usage.printable(ref)} is {usage.printable(backend.name)}"
                               f", the certificate is of {usage.printable(name)}")
    version, certified = str(backend.framework_version()), cert["backend"]["framework_version"]
    if version != certified:
        print(f"mhaspec audit: note: the certificate ran {cert['backend']['framework']} "
              f"{certified}, this audit runs {version}", flush=True)
    print(f"mhaspec audit: {usage.printable(name)} (certificate of {cert['issued']}, spec "
          f"{cert['spec']['version']}), seed {seed}, {args.examples} examples per test", flush=True)
    results = rerun(cert, seed=seed, examples=args.examples, ref=ref,
                    timeout=args.timeout)
    rows = differences(cert, results)
    listed = len(cert["clauses"])
    if rows:
        print(table(rows))
        for line in why(rows, results):
            print(f"  {line}")
        print(f"mhaspec audit: {len(rows)} of {listed} clauses differ from the certificate "
              f"({len(results)} tests run, seed {seed})")
        return 1
    print(f"mhaspec audit: all {listed} clauses reproduce the certificate's verdicts "
          f"({len(results)} tests run, seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
