"""Certificates: what a conformance run found, per clause, in a form others can check.

A certificate is JSON (validated by ``certificate.schema.json``, shipped with the package) with a
SHA-256 of its canonical body, so an edited copy is detected by :func:`verify`; and Markdown for
people (:func:`to_markdown`, every string from the backend escaped). The body is canonical JSON: keys
sorted, no whitespace, UTF-8. :func:`check_consistency` checks that the recorded verdict follows from
the recorded clauses and that the clauses are exactly those of a released spec version. Neither says
who issued a certificate: that is what a detached signature (``mhaspec sign``) is for.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import re
import subprocess
from collections import Counter
from importlib import resources
from typing import Any

SCHEMA_ID = "mhaspec-certificate/1"
#: Largest certificate ``verify`` reads, in bytes (a certificate is about 30 KB).
MAX_BYTES = 16 * 2**20
#: The namespace of OpenSSH signatures over certificates (``ssh-keygen -Y sign -n ...``).
SIGNATURE_NAMESPACE = "mhaspec-certificate"


class CertificateError(ValueError):
    """A certificate that is malformed, fails its schema or whose digest does not match."""


def schema() -> dict:
    return json.loads(resources.files("mhaspec").joinpath("certificate.schema.json").read_text("utf-8"))


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal(body: dict) -> dict:
    """The certificate: ``body`` plus ``sha256`` of its canonical form."""
    return {**body, "sha256": hashlib.sha256(canonical(body)).hexdigest()}


def loads(text: str | bytes) -> Any:
    """Parse a certificate's JSON, refusing duplicate keys (a reader would see only the last),
    NaN and Infinity (not JSON), numbers too large for a float64 (``1e999`` would read as
    infinity; a 400-digit integer cannot be formatted as a ratio), numbers too long to parse, nesting too deep to parse and strings that are not
    Unicode text (a lone surrogate such as ``"\\ud800"``); raises :class:`CertificateError`."""
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                            parse_constant=_no_constant, parse_float=_finite_float,
                            parse_int=_float_sized_int)
        canonical(parsed)  # every string encodes as UTF-8 (linear: one pass)
    except RecursionError:
        raise CertificateError("JSON nested too deeply") from None
    except CertificateError:
        raise
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode("ascii")
        raise CertificateError(f"a string holds {bad}, a lone surrogate: not Unicode "
                               f"text") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit integer
        raise CertificateError(f"not JSON: {exc}") from None
    return parsed


def _no_constant(name: str):
    raise CertificateError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CertificateError(f"the number {text[:40]} is too large for a float64 (it would read "
                               f"as infinity)")
    return value


def _float_sized_int(text: str) -> int:
    value = int(text)  # over 4300 digits: ValueError, reported as "not JSON"
    if abs(value) > MAX_INT:
        raise CertificateError(f"the integer {text[:40]}... is too large for a float64")
    return value


#: Largest integer a certificate may hold: float64's largest finite value, rounded down.
MAX_INT = int(1.7976931348623157e308)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise CertificateError(f"the key {key!r} appears twice in one object")
        seen.add(key)
    return dict(pairs)


def verify(cert: Any) -> dict:
    """Check schema and digest; returns the certificate or raises :class:`CertificateError`."""
    import jsonschema

    try:
        jsonschema.validate(cert, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise CertificateError(f"certificate does not match {SCHEMA_ID} at {where}: {exc.message}") from None
    body = {k: v for k, v in cert.items() if k != "sha256"}
    digest = hashlib.sha256(canonical(body)).hexdigest()
    if digest != cert["sha256"]:
        raise CertificateError(f"certificate digest mismatch: recorded {cert['sha256'][:16]}..., "
                               f"content hashes to {digest[:16]}...: it was edited after sealing")
    return cert


def released_clauses(version: str) -> tuple[tuple[str, str, bool], ...] | None:
    """(id, title, testable) of every clause of spec ``version``, or None for an unknown version.

    The current version's clauses come from :func:`mhaspec.spec.load`; earlier released versions
    from their frozen renderings (``spec/mhaspec-<version>.md``)."""
    from mhaspec.spec import load

    spec = load()
    if version == spec.version:
        return tuple((c.id, c.title, c.testable) for c in spec.clauses)
    if not re.fullmatch(r"[0-9]+\.[0-9]+", version):
        return None
    rendering = resources.files("mhaspec.spec").joinpath(f"mhaspec-{version}.md")
    if not rendering.is_file():
        return None
    return clauses_of_rendering(rendering.read_text("utf-8"))


#: A clause heading of a rendering: ``### ID: title[ *(informative)*] {#ID}``
CLAUSE_HEADING = re.compile(r"^### ([A-Z]+-[0-9]+): (.*?)( \*\(informative\)\*)? \{#\1\}$", re.M)


def clauses_of_rendering(text: str) -> tuple[tuple[str, str, bool], ...]:
    """(id, title, testable) of each clause heading of a rendered specification."""
    return tuple((m[1], m[2], not m[3]) for m in CLAUSE_HEADING.finditer(text))


def check_consistency(cert: dict) -> list[str]:
    """Check that ``cert`` (already :func:`verify`-ed) says only what its clauses support; returns
    what was checked, one line each, or raises :class:`CertificateError`. Linear in the size of
    the certificate.

    * the spec version is one this package knows (a release or the current version);
    * its clauses are exactly that version's clauses, each once, with their titles, and informative
      clauses are ``not-run``;
    * each clause's verdict is one its record supports (:func:`check_clause`);
    * ``satisfied_by`` and ``stale_on`` follow :func:`~mhaspec.conformance.verdicts.entry_problem`
      (only a pass of a clause the shared validation checks can be the adapter's);
    * every claimed device x dtype cell appears in some clause's ``ran_on`` or ``not_run_on``
      (unless nothing was checked);
    * the summary's verdict and counts are those :func:`~mhaspec.conformance.verdicts.overall_verdict`
      and :func:`~mhaspec.conformance.verdicts.count_verdicts` compute from the clauses;
    * the backend did not run inside the judging process (:func:`backend_process`).
    """
    from mhaspec.backends.validation import REJECTION_CLAUSES
    from mhaspec.conformance.verdicts import (CONFORMS, NOT_CHECKED, count_verdicts, describe_counts,
                                              entry_problem, overall_verdict)

    version = cert["spec"]["version"]
    known = released_clauses(version)
    if known is None:
        raise CertificateError(f"spec version {version!r} is not a version this mhaspec knows")
    if superseded_draft(cert):
        raise CertificateError(f"issued against the {version} draft, and {version} has since been "
                               f"released: re-issue it with `mhaspec certify`")
    status = spec_status(version)
    if cert["spec"].get("status", "released") != status:
        raise CertificateError(f"spec {version} is {status} here, the certificate says "
                               f"{cert['spec'].get('status', 'released')}")
    seen = Counter(c["id"] for c in cert["clauses"])
    twice = sorted(i for i, n in seen.items() if n > 1)
    expected = {cid: (title, testable) for cid, title, testable in known}
    missing = [cid for cid in expected if cid not in seen]
    unknown = sorted(set(seen) - set(expected))
    if twice or missing or unknown:
        raise CertificateError(f"the clauses are not those of spec {version}: "
                               f"missing {missing[:20]}, unknown {unknown[:20]}, "
                               f"repeated {twice[:20]}")
    strange = sorted(key for key in cert["backend"]["deviations"]
                     if key.partition("@")[0] not in expected)
    if strange:
        raise CertificateError(f"it declares deviations of {', '.join(strange[:5])}: no clause of "
                               f"spec {version}")
    slashed = sorted(d for d in cert["environment"]["devices"] if "/" in d)
    if slashed:
        raise CertificateError(f"device {slashed[0]!r} has a '/' in its name: its cells "
                               f"(device/dtype) are ambiguous")
    cells = {f"{d}/{t}" for d, v in cert["environment"]["devices"].items() for t in v["dtypes"]}
    for c in cert["clauses"]:
        title, testable = expected[c["id"]]
        if c["title"] != title:
            raise CertificateError(f"clause {c['id']} has the title {c['title']!r}, spec {version} "
                                   f"says {title!r}")
        if not testable and c["verdict"] != "not-run":
            raise CertificateError(f"clause {c['id']} is informative in spec {version} but has the "
                                   f"verdict {c['verdict']!r}")
        check_clause(c, cert["backend"], cells)
        problem = entry_problem(c, REJECTION_CLAUSES)
        if problem:
            raise CertificateError(problem)
    verdict, counts = overall_verdict(cert["clauses"]), count_verdicts(cert["clauses"])
    if cert["summary"]["verdict"] != verdict:
        raise CertificateError(f"the summary says {cert['summary']['verdict']!r}, its clauses give "
                               f"{verdict!r}")
    if cert["summary"]["counts"] != counts:
        raise CertificateError(f"the summary counts {cert['summary']['counts']} are not the clauses' "
                               f"{counts}")
    status = cert.get("run", {}).get("pytest_exit_status", 0)
    if verdict == CONFORMS and status != 0:
        raise CertificateError(f"it conforms, but its pytest run ended with exit status {status}: "
                               f"a conforming run exits 0")
    covered = {x for c in cert["clauses"] for x in (*c["ran_on"], *c.get("not_run_on", ()))}
    if verdict != NOT_CHECKED and cells - covered:
        raise CertificateError(f"it claims {', '.join(sorted(cells - covered))}, where no clause "
                               f"ran (nor is recorded as not run)")
    testable = sum(t for _, _, t in known)
    return [backend_process(cert),
            f"consistency: the {len(known)} clauses of spec {version} ({testable} testable) each "
            f"present once with their titles",
            f"consistency: each clause's verdict is supported by its runs, the claimed "
            f"capabilities and the declared deviations; every claimed cell "
            f"({', '.join(sorted(cells)) or 'none'}) ran",
            f"consistency: the summary ({verdict}; "
            f"{describe_counts(cert['clauses'], {cid for cid, _, t in known if t})}) "
            f"is the one its clauses give"]


def check_clause(clause: dict, backend: dict, cells: set[str]) -> None:
    """Refuse (:class:`CertificateError`) a clause entry whose verdict its record does not
    support: a pass needs at least one run, a cell it ran on, a claimed capability (every test
    requires one) and every capability the clause needs
    (:data:`~mhaspec.conformance.clause_capabilities.NEEDS`) among the claimed ones; a deviation
    (or stale deviation) needs a declared deviation of that clause (``ID`` or ``ID@op``); every
    cell it ran on must be a claimed one (``cells``: ``device/dtype``)."""
    from mhaspec.conformance.clause_capabilities import NEEDS
    from mhaspec.conformance.tolerance import K

    cid, verdict = clause["id"], clause["verdict"]
    outside = sorted(set(clause["ran_on"]) - cells)
    if outside:
        raise CertificateError(f"clause {cid} ran on {', '.join(outside)}, which the certificate "
                               f"does not claim")
    if verdict == "pass":
        ratio = clause.get("worst_ratio")
        if ratio is not None and not ratio <= K * (1 + 1e-9):
            raise CertificateError(f"clause {cid} passes with a NUM-3 ratio of {ratio:.3g}, past "
                                   f"K = {K:g}: a pass needs a ratio of at most K")
        if clause["runs"] < 1 or not clause["ran_on"]:
            raise CertificateError(f"clause {cid} passes with {clause['runs']} runs on "
                                   f"{clause['ran_on'] or 'no cell'}: a pass needs a run")
        claimed = set(backend["capabilities"]).union(
            *backend.get("capabilities_by_operation", {}).values())
        if not claimed:
            raise CertificateError(f"clause {cid} passes, but the backend claims no capability: "
                                   f"no test can have run")
        lacking = sorted(NEEDS.get(cid, frozenset()) - claimed)
        if lacking:
            raise CertificateError(f"clause {cid} passes, but it needs {', '.join(lacking)}, "
                                   f"which the backend does not claim")
    if verdict in ("deviation", "stale-deviation") and not any(
            key.partition("@")[0] == cid for key in backend["deviations"]):
        raise CertificateError(f"clause {cid} has the verdict {verdict!r}, but the backend "
                               f"declares no deviation of {cid}")


def backend_process(cert: dict) -> str:
    """Where the certified backend ran, as a line; :class:`CertificateError` for a certificate
    that says it ran inside the judging process (``mhaspec certify`` issues none such)."""
    run = cert.get("run", {})
    where = run.get("backend_process")
    if where == "in-process":
        raise CertificateError("the backend ran inside the judging process: certificates are issued "
                               "through the sealed path only (`mhaspec certify`)")
    if where is None:
        return ("backend process: not recorded (issued before the sealed path: the backend ran "
                "inside the judging process)")
    startup = run.get("startup_code")
    return (f"backend process: its own, sealed from the judge (restarted "
            f"{run.get('backend_restarts', 0)} times after a hang or a crash); "
            f"{run.get('sandbox', 'sandbox not recorded')}"
            + ("" if startup is None else f"; start-up code in the judging process: "
               f"{len(startup)} ({'; '.join(startup)[:600] or 'none'})"))


def git_commit(package_dir: pathlib.Path | None = None) -> str | None:
    """The commit of mhaspec's own checkout, or None when mhaspec is not run from one.

    An installed copy inside someone else's git repository must not report that repository's
    commit: the git top level must be the project root of ``package_dir`` (src/mhaspec's parent's
    parent, holding mhaspec's pyproject.toml)."""
    package_dir = pathlib.Path(package_dir or pathlib.Path(__file__).parent).resolve()
    root = package_dir.parent.parent
    try:
        pyproject = (root / "pyproject.toml").read_text("utf-8")
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=package_dir)
    except (OSError, UnicodeDecodeError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not re.search(r'^name = "mhaspec"$', pyproject, re.M):
        return None
    lines = out.stdout.split()
    if len(lines) != 2 or pathlib.Path(lines[0]).resolve() != root:
        return None
    return lines[1]


def signature_path(path: pathlib.Path) -> pathlib.Path:
    """Where :func:`sign` writes the detached signature of the certificate ``path``."""
    return pathlib.Path(f"{path}.sig")


def sign(path: pathlib.Path, key: pathlib.Path) -> pathlib.Path:
    """Sign the certificate file ``path`` with the OpenSSH private ``key``; returns the detached
    signature :func:`signature_path` (``ssh-keygen -Y sign -n mhaspec-certificate``). An existing
    signature file is refused (ssh-keygen would keep it): the caller removes it first."""
    sig = signature_path(path)
    if os.path.lexists(sig):
        raise CertificateError(f"{sig} exists: remove it first")
    # an absolute path: a file named like an option ("-h") stays a file name
    _ssh_keygen("-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, str(path.absolute()))
    if not sig.is_file():
        raise CertificateError(f"ssh-keygen reported success but wrote no {sig}")
    return sig


def check_signature(data: bytes, signature: pathlib.Path, allowed_signers: pathlib.Path,
                    identity: str) -> str:
    """Check the detached OpenSSH ``signature`` over the certificate bytes ``data`` against the
    keys ``allowed_signers`` lists for ``identity``; returns ssh-keygen's one-line report or raises
    :class:`CertificateError`."""
    return _ssh_keygen("-Y", "verify", "-f", str(allowed_signers), "-I", identity,
                       "-n", SIGNATURE_NAMESPACE, "-s", str(signature), stdin=data)


def _ssh_keygen(*args: str, stdin: bytes | None = None) -> str:
    try:
        out = subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, timeout=60,
                             stdin=None if stdin is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise CertificateError("ssh-keygen (OpenSSH 8.1 or later) is needed for signatures and "
                               "was not found") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise CertificateError(f"ssh-keygen failed: {exc}") from None
    text = " ".join((out.stdout + out.stderr).decode("utf-8", "replace").split())
    if out.returncode != 0:
        raise CertificateError(f"ssh-keygen {args[1]} failed: "
                               f"{text or f'exit status {out.returncode}'}")
    return text


_MD_ESCAPES = {c: "\\" + c for c in "\\`*_[]|~"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;",
                                                  "$": "&#36;"}


def md_text(text: object) -> str:
    """``text`` as inline Markdown that renders literally: one line (newlines and other control
    characters become spaces), emphasis, code, links, table cells, HTML and ``$`` (the site's
    LaTeX delimiter) escaped. An underscore
    between two letters or digits (``split_heads``) cannot open or close emphasis and stays as is."""
    line = "".join(c if c.isprintable() else " " for c in str(text))
    return "".join(c if c == "_" and 0 < i < len(line) - 1 and line[i - 1].isalnum()
                   and line[i + 1].isalnum() else _MD_ESCAPES.get(c, c)
                   for i, c in enumerate(line))


def md_fenced(text: str) -> list[str]:
    """``text`` in a code fence longer than any run of backticks inside it (so it cannot close the
    fence); control characters other than newlines are written as escapes."""
    safe = "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii")
                   for c in text)
    longest = max((len(m) for m in re.findall(r"`+", safe)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, safe, fence]


def spec_status(version: str) -> str:
    """"draft" for the current version while it is a draft, else "released"."""
    from mhaspec.spec import load

    current = load()
    return current.status if version == current.version else "released"


def superseded_draft(cert: dict) -> bool:
    """True for a certificate issued against a draft of a version that is now released: the draft's
    clauses are not kept anywhere, so it can be neither checked for consistency nor compared with
    the release's certificates; it stays a record of its run until it is re-issued."""
    spec = cert["spec"]
    return spec.get("status") == "draft" and spec_status(spec["version"]) == "released"


def spec_label(spec: dict) -> str:
    """``1.2 (draft)`` or ``1.1``: a certificate's spec version as people should read it."""
    return spec["version"] + (" (draft)" if spec.get("status") == "draft" else "")


def process_row(run: dict) -> list[str]:
    """The Markdown row saying where the backend ran (none for a certificate that does not say)."""
    if run.get("backend_process") != "sealed":
        return []
    return [f"| backend process | its own, sealed from the judge; restarted "
            f"{run.get('backend_restarts', 0)} times |"]


def condition_values(conditions: list[str]) -> tuple[str, int, str]:
    """A clause's recorded ``conditions`` (rows ``"dim=value, ..."``, then ``"not implemented:
    ..."``) compactly: ``("dim: v1, v2; dim: ...", rows, "kept-out values")``."""
    rows = [c for c in conditions if not c.startswith("not implemented: ")]
    values: dict[str, list[str]] = {}
    for row in rows:
        for item in row.split(", "):
            dim, _, value = item.partition("=")
            if value not in values.setdefault(dim, []):
                values[dim].append(value)
    from mhaspec.conformance.conditions import DIMENSIONS

    def order(dim: str, value: str) -> int:  # the space's order of values, others last
        known = DIMENSIONS.get(dim, ())
        return known.index(value) if value in known else len(known)

    kept_out = [c.removeprefix("not implemented: ") for c in conditions if c not in rows]
    return ("; ".join(f"{d}: {', '.join(sorted(v, key=lambda x: order(d, x)))}"
                      for d, v in values.items()), len(rows), ", ".join(kept_out))


def to_markdown(cert: dict) -> str:
    """A human-readable rendering of a certificate; every string it takes from the certificate is
    escaped (:func:`md_text`, :func:`md_fenced`), so none can add a heading, a table cell or HTML."""
    from mhaspec.conformance.tolerance import format_ratio
    from mhaspec.conformance.verdicts import backend_notes, verdict_label

    b = cert["backend"]
    informative = {cid for cid, _, t in released_clauses(cert["spec"]["version"]) or () if not t}
    devices = cert["environment"]["devices"]
    device_names = ", ".join(f"{md_text(d)}: {md_text(v['name'])}" for d, v in devices.items())
    device_dtypes = "; ".join(f"{md_text(d)}: " + ", ".join(v["dtypes"]) for d, v in devices.items())
    hyp = cert["hypothesis"]
    commit = cert["suite"]["git_commit"] or "unknown"
    from mhaspec import coverage

    claimed = ", ".join(md_text(c) for c in b.get("capabilities", [])) or "none"
    lines = [f"# mhaspec certificate: {md_text(b['name'])}", "",
             f"**Verdict: {coverage.headline(cert)}** (suite {md_text(cert['suite']['version'])}, "
             f"commit {md_text(commit)}), for the capabilities it claims: {claimed}.", "",
             "| | |", "|---|---|",
             f"| covers | {coverage.summary(coverage.of(cert))} |",
             f"| backend | {md_text(b['name'])} ({md_text(b['ref'])}) |",
             f"| framework | {md_text(b['framework'])} {md_text(b['framework_version'])} |",
             f"| devices | {device_names} |",
             f"| dtypes | {device_dtypes} |",
             f"| hypothesis | profile {hyp['profile']}, "
             f"{md_text(hyp['inputs']) if hyp.get('inputs') else 'seed ' + str(hyp['seed'])}, "
             + (f"{hyp['examples']} Hypothesis examples, " if "examples" in hyp else "")
             + f"{hyp['backend_calls']} backend calls |",
             f"| issued | {md_text(cert['issued'])} |",
             *process_row(cert.get("run", {})), "",
             "| clause | title | verdict | worst NUM-3 ratio | runs | ran on |",
             "|---|---|---|---|---|---|"]
    for c in cert["clauses"]:
        ran_on = ", ".join(md_text(x) for x in c["ran_on"])
        if c.get("not_run_on"):
            ran_on += "; NOT RUN on " + ", ".join(md_text(x) for x in c["not_run_on"])
        ratio = "not finite" if c["worst_ratio"] is None else format_ratio(c["worst_ratio"])
        lines.append(f"| {md_text(c['id'])} | {md_text(c['title'])} | "
                     f"{md_text(verdict_label(c, informative))} | {ratio} | {c['runs']} | {ran_on} |")
    notes = backend_notes(cert["clauses"])
    if notes:
        lines += [""] + [f"- {md_text(n)}" for n in notes]
    if b["deviations"]:
        lines += ["", "Declared deviations:", ""]
        lines += [f"- **{md_text(k)}**: {md_text(v)}" for k, v in sorted(b["deviations"].items())]
    groups = cert.get("failure_groups") or []
    if groups:
        run = cert.get("run", {})
        lines += ["", "## Failures by likely cause", ""]
        for g in groups:
            typical = g.get("typical_relative_error")
            by = f", typical relative error {typical:.0e}" if typical is not None else ""
            lines.append(f"- **{md_text(g['cause'])}** {len(g['clauses'])} clauses, {g['tests']} "
                         f"tests on {', '.join(md_text(c) for c in g['cells'])}{by}: "
                         + ", ".join(md_text(c) for c in g["clauses"]))
        if run.get("failures_not_shrunk"):
            lines += ["", f"{run['failures_not_shrunk']} failures were not shrunk (shrinking: "
                          f"{md_text(run.get('shrink', ''))}; `--mhaspec-shrink-all` shrinks every one)."]
    ran = [c for c in cert["clauses"] if c.get("conditions")]
    if ran:
        lines += ["", "## Conditions that ran", "",
                  "Per clause, the values of each dimension of its condition space its cases held "
                  "(`conformance/conditions.py`), the number of distinct combinations, and what a "
                  "capability not claimed kept out.", "",
                  "| clause | values | combinations | not implemented |", "|---|---|---|---|"]
        for c in ran:
            values, count, kept_out = condition_values(c["conditions"])
            lines.append(f"| {md_text(c['id'])} | {md_text(values)} | {count} | "
                         f"{md_text(kept_out) or '-'} |")
    failing = [c for c in cert["clauses"] if c["failures"]]
    if failing:
        lines += ["", "## Failures", ""]
        for c in failing:
            for msg in c["failures"]:
                lines += [f"### {md_text(c['id'])}", "", *md_fenced(msg), ""]
    lines += ["", f"SHA-256 of the canonical body: `{cert['sha256']}` (check with `mhaspec verify`)."]
    return "\n".join(lines) + "\n"
