"""Certificates: what a conformance run found, per clause, in a form others can check.

A certificate is JSON (validated by ``certificate.schema.json``, shipped with the package) with a
SHA-256 of its canonical body, so an edited copy is detected by :func:`verify`; and Markdown for
people (:func:`to_markdown`, every string from the backend escaped). The body is canonical JSON: keys
sorted, no whitespace, UTF-8. :func:`check_consistency` checks that the recorded verdict follows from
the recorded clauses and that the clauses are exactly those of a released spec version. Neither says
who issued a certificate: that is what a detached signature (``mhaspec sign``,
:mod:`mhaspec.certificate_signature`) is for.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import pathlib
import platform
import re
import subprocess
from collections import Counter
from importlib import resources
from typing import Any, NamedTuple

from mhaspec import suite_files
from mhaspec.backends import behaviours
from mhaspec.backends.validation import REJECTION_CLAUSES
from mhaspec.conformance.clause_capabilities import NEEDS
from mhaspec.conformance.tolerance import K
from mhaspec.conformance.verdicts import (CONFORMS, NOT_CHECKED, count_verdicts, describe_counts,
                                          entry_problem, overall_verdict)
from mhaspec.spec import load

SCHEMA_ID = "mhaspec-certificate/1"
#: Largest certificate ``verify`` reads, in bytes (a certificate is about 30 KB).
MAX_BYTES = 16 * 2**20


class CertificateError(ValueError):
    """A certificate that is malformed, fails its schema or whose digest does not match."""


def schema() -> dict:
    return json.loads(resources.files("mhaspec").joinpath("certificate.schema.json").read_text("utf-8"))


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal(body: dict) -> dict:
    """The certificate: ``body`` plus ``sha256`` of its canonical form."""
    return {**body, "sha256": hashlib.sha256(canonical(body)).hexdigest()}


class BackendRecord(NamedTuple):
    """What a certificate says of its backend: the reference it was loaded by, its name,
    framework and version, protocol version, claimed capabilities, declared deviations (key ->
    reason) and, for a backend that scopes them, the capabilities of each operation."""

    ref: str
    name: str
    framework: str
    framework_version: str
    protocol_version: int
    capabilities: list[str]
    deviations: dict[str, str]
    capabilities_by_operation: dict[str, list[str]] | None = None


def body(*, spec, suite_version: str, backend: BackendRecord,
         devices: dict[str, tuple[str, list[str], dict[str, str]]],
         unavailable_devices: dict[str, str], hypothesis: dict, results: list[dict], run: dict,
         failure_groups: list[dict], clauses: list[dict]) -> dict:
    """The body of a certificate (:data:`SCHEMA_ID`, ``certificate.schema.json``) of a run of the
    suite against ``spec`` (a :class:`mhaspec.spec.Spec`), before :func:`seal`.

    ``devices``: claimed device -> (its name, the dtypes run, its precision flags);
    ``hypothesis``: the settings as run (profile, seed, max_examples, derandomize, phases);
    ``results``: the run's result records (their calls and examples are counted, their unshrunk
    failures too); ``run``: what ran (pytest arguments and exit status, selection, ...);
    ``failure_groups``: :func:`~mhaspec.conformance.verdicts.failure_groups`; ``clauses``: the
    clause entries of :func:`~mhaspec.conformance.verdicts.clause_verdicts`. The summary is
    computed from the clauses, as :func:`check_consistency` checks it."""
    scoped = ({} if backend.capabilities_by_operation is None
              else {"capabilities_by_operation": backend.capabilities_by_operation})
    return {
        "schema": SCHEMA_ID,
        "spec": {"name": spec.name, "version": spec.version, "status": spec.status},
        "suite": {"version": suite_version, "git_commit": git_commit(),
                  "files_sha256": suite_files.digest()},
        "backend": {"ref": backend.ref, "name": backend.name, "framework": backend.framework,
                    "framework_version": backend.framework_version,
                    "protocol_version": backend.protocol_version,
                    "capabilities": backend.capabilities, "deviations": backend.deviations,
                    **scoped},
        "environment": {
            "python": platform.python_version(), "platform": platform.platform(),
            "devices": {d: {"name": name, "dtypes": dtypes, "precision_flags": flags}
                        for d, (name, dtypes, flags) in devices.items()},
            "unavailable_devices": unavailable_devices},
        "hypothesis": {**hypothesis,
                       "backend_calls": sum(r.get("calls", 0) for r in results),
                       "examples": sum(r.get("examples", 0) for r in results)},
        "run": {**run, "failures_not_shrunk": sum(r.get("shrunk") is False for r in results)},
        "failure_groups": [{k: g[k] for k in ("cause", "clauses", "cells", "tests",
                                              "typical_relative_error", "common") if k in g}
                           for g in failure_groups],
        "issued": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "clauses": clauses,
        "summary": {"verdict": overall_verdict(clauses), "counts": count_verdicts(clauses)},
    }


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
                     if key.partition("@")[0] not in expected and not behaviours.known(key))
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
            key.partition("@")[0] == cid for key in backend["deviations"]) \
            and not behaviours.may_show_in(backend["deviations"], cid):
        raise CertificateError(f"clause {cid} has the verdict {verdict!r}, but the backend "
                               f"declares no deviation of {cid} nor a behaviour that shows in it")


def process_details(run: dict) -> str:
    """``", one in each of 2 judging workers, interpreter ..."``: what a certificate's ``run`` says
    of the backend's processes beyond "its own" (empty for one judging process and no
    interpreter recorded)."""
    workers = run.get("workers", 1)
    details = "" if workers == 1 else f", one in each of {workers} judging workers"
    python = run.get("backend_interpreter")
    return details + ("" if python is None else f", interpreter {python}")


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
    return (f"backend process: its own{process_details(run)}, sealed from the judge (restarted "
            f"{run.get('backend_restarts', 0)} times after a hang or a crash); "
            f"{run.get('sandbox', 'sandbox not recorded')}"
            + ("" if startup is None else f"; start-up code in the judging process: "
               f"{len(startup)} ({'; '.join(startup)[:600] or 'none'})"))


def suite_identity(suite: dict) -> str:
    """The suite's code as a certificate names it: its git commit, else the SHA-256 of its
    installed files (:mod:`mhaspec.suite_files`; an install outside a checkout), else unknown."""
    if suite.get("git_commit"):
        return f"commit {suite['git_commit']}"
    if suite.get("files_sha256"):
        return f"files SHA-256 {suite['files_sha256']}"
    return "commit unknown"


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


def spec_status(version: str) -> str:
    """"draft" for the current version while it is a draft, else "released"."""
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
