"""``mhaspec certify``: run the conformance suite on one backend and write its certificate.

The certificate records what RAN, not what was asked for: the exact pytest arguments (the run's
temporary directory written ``<tmp>``, the suite's folder ``<suite>``, the failures folder
``<output-dir>/NAME-failures``), the selection (``-k``, ``-m``, ``--deselect``, ``--mhaspec-dtypes``) and the items of claimed cells
that did not run, the Hypothesis settings the run used (profile, seed, max_examples, derandomize,
phases) and the per-call time limit. The verdict comes from
:func:`mhaspec.conformance.verdicts.overall_verdict`, computed once: a claimed device x dtype cell
whose testable clauses did not all run makes it "incomplete".

Every file written stays inside ``--output-dir``: the backend's name is reduced to a safe file name
(:func:`file_stem`; the real name stays inside the certificate), and the outputs are checked
before the suite runs (a usage error, exit status 2, when the directory is a file or read-only or
a target path is a directory, or the certificate there is another backend's). The suite runs in
this process through :mod:`mhaspec.runner`, isolated from the caller's pytest configuration; the
backend runs in a process of its own (:mod:`mhaspec.sealed`): its claims are read once, checked and
frozen before the run, and used for the run and the certificate alike; the certificate records
that path (``run.backend_process``).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import time

from mhaspec import (__version__, backend_process, certificate, certificate_markdown,
                     installed_version, judge_files, runner, sealed, sealed_workers)
from mhaspec.backends.claim_readers import OPS, cell_deviations, op_capabilities
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec
from mhaspec.usage import UsageError, one_line, printable, writable_dir, writable_file

DEFAULT_PROFILE = "certify"
#: What a run of a profile costs, said before it starts (measured on a 2-core machine, spec 1.4:
#: numpy-batched ~1 min under ci and ~5 under certify; an eager JAX backend ~25 min under ci).
EXPECT_MINUTES = {
    "certify": "the certify profile (100 examples a test) takes minutes for a NumPy or PyTorch "
               "backend and can take hours for one that compiles per shape (eager JAX); "
               "--profile ci is the fixed, quicker run",
    "ci": "the ci profile takes about a minute for a NumPy or PyTorch backend and can take half "
          "an hour for one that compiles per shape (eager JAX)",
}
#: pytest-xdist off in a run of one judging process (``--workers 1``); with more, each worker has
#: a sealed backend of its own (:mod:`mhaspec.sealed_workers`), never one loaded inside it
NO_WORKERS = ("-p", "no:xdist")


def file_stem(name: str) -> str:
    """A file name for backend ``name``: letters, digits, ``_``, ``-`` and single inner dots only,
    its last 100 characters (``../../x`` -> ``x``, ``/abs/x`` -> ``abs_x``)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    stem = re.sub(r"\.{2,}", "_", stem).strip("._-")[-100:].strip("._-")
    return stem or "backend"


def output_paths(out_dir, name: str) -> dict[str, pathlib.Path]:
    """The certificate JSON, its Markdown, the failures folder and the folder of passing samples of
    backend ``name``, checked to lie inside ``out_dir`` and to be writable (:class:`UsageError`
    otherwise)."""
    out_dir = writable_dir(out_dir)
    stem = file_stem(name)
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md",
             "failures": out_dir / f"{stem}-failures", "passes": out_dir / f"{stem}-passes"}
    root = out_dir.resolve()
    for path in paths.values():
        if path.resolve().parent != root:
            raise UsageError(f"output {printable(path)} would leave {printable(out_dir)}")
    writable_file(paths["json"])
    writable_file(paths["markdown"])
    for folder in ("failures", "passes"):
        if paths[folder].exists() and not paths[folder].is_dir():
            raise UsageError(f"{folder} folder {printable(paths[folder])} is a file")
    return paths


def check_not_another_backends(path: pathlib.Path, ref: str) -> None:
    """Refuse (:class:`UsageError`) to overwrite ``path`` unless it is absent or a certificate of
    the same backend reference ``ref``: re-certifying a backend replaces its certificate, but a
    backend whose name reduces to the same file name (``numpy-batched`` from another module) must
    not silently replace another backend's."""
    if not path.exists():
        return
    try:
        recorded = certificate.loads(path.read_bytes())["backend"]["ref"]
    except (OSError, certificate.CertificateError, KeyError, TypeError):
        recorded = None
    if recorded != ref:
        what = ("the certificate of " + printable(recorded) if isinstance(recorded, str)
                else "not a certificate")
        raise UsageError(f"{printable(path)} is {what}, not of {printable(ref)}: certifying "
                         f"would overwrite it; choose another --output-dir or remove it")


def recorded_args(args: list[str], *folders: pathlib.Path) -> list[str]:
    """The pytest arguments as a certificate records them: the run's temporary directory (that of
    its ``-c`` ini file) written ``<tmp>``, its ``--rootdir`` (the suite's folder) ``<suite>``, the
    output ``folders`` (failures, passes) ``<output-dir>/NAME-failures``, so a certificate names no
    path of the machine that issued it."""
    def value_of(option: str) -> str | None:
        return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == option), None)

    ini, suite = value_of("-c"), value_of("--rootdir")
    places = [(str(pathlib.PurePath(ini).parent), "<tmp>")] if ini else []
    places += [(suite, "<suite>")] if suite else []
    out = []
    for arg in args:
        folder = next((f for f in folders if arg == str(f)), None)
        if folder is not None:
            arg = f"<output-dir>/{folder.name}"
        for place, symbol in places:
            if arg == place or arg.startswith(place + "/"):
                arg = symbol + arg[len(place):]
                break
        out.append(arg)
    return out


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def operation_capabilities(backend) -> dict[str, list[str]] | None:
    """``{op: [capability, ...]}`` for a backend that scopes its capabilities to an operation
    (``capabilities_for``), else None."""
    if getattr(backend, "capabilities_for", None) is None:
        return None
    return {op: sorted(op_capabilities(backend, op)) for op in OPS}


def declared_deviations(backend, claimed: dict[str, list[str]]) -> dict[str, str]:
    """Key -> reason of every deviation ``backend`` declares for the ``claimed`` cells (device ->
    dtypes): its ``deviations``, and those it declares for some cells only (``deviations_on``),
    each reason then led by the cells it holds on (``"on cpu/float16: ..."``)."""
    out = dict(backend.deviations)
    scoped: dict[tuple[str, str], list[str]] = {}
    for device, dtypes in claimed.items():
        for dtype in dtypes:
            for key, reason in cell_deviations(backend, device, dtype).items():
                if out.get(key) != reason:
                    scoped.setdefault((key, reason), []).append(f"{device}/{dtype}")
    for (key, reason), cells in scoped.items():
        note = f"on {', '.join(cells)}: {reason}"
        out[key] = f"{out[key]}; {note}" if key in out else note
    return dict(sorted(out.items()))


def check_suite_version(installed: str | None = None) -> str:
    """The suite version a certificate records: that of the code that runs (``mhaspec.__version__``).
    A :class:`UsageError` when the installed package metadata (``installed``, default: read now)
    names another version, as an editable install made before a version change does."""
    installed = installed_version() if installed is None else installed
    if installed is not None and installed != __version__:
        raise UsageError(f"the mhaspec code that runs is version {__version__} but its installed "
                         f"metadata says {printable(installed)}: reinstall it (pip install -e . in "
                         f"the checkout) so that the certificate names the suite that ran")
    return __version__


def check_pytest_args(pytest_args: list[str]) -> None:
    """Refuse, before the run, pytest arguments certify cannot honour: a ``--hypothesis-seed`` that
    is not an integer, and plugins or workers (``-p NAME``, ``-n``, ``--dist``): a plugin would run
    inside the judging process, and pytest-xdist's own workers would load the backend there
    (``--workers N`` starts workers that do not)."""
    for i, arg in enumerate(pytest_args):
        value = arg.partition("=")[2] if "=" in arg else (
            pytest_args[i + 1] if i + 1 < len(pytest_args) else "")
        if (arg == "--hypothesis-seed" or arg.startswith("--hypothesis-seed=")) \
                and not re.fullmatch(r"-?[0-9]+", value):
            raise UsageError(f"--hypothesis-seed must be an integer, got {printable(value)!r}")
        plugin = value if arg in ("-p", "--plugin") else arg[2:] if arg.startswith("-p") else None
        if plugin is not None and not plugin.startswith("no:"):
            raise UsageError(f"certify loads no other pytest plugin: {printable(arg)} "
                             f"{printable(plugin) if arg == '-p' else ''}".strip())
        if arg.split("=")[0] in ("-n", "--numprocesses", "--dist", "--tx") or (
                arg.startswith("-n") and arg[2:].isdigit()):
            raise UsageError(f"certify starts its own workers (--workers N), not pytest-xdist's: "
                             f"{printable(arg)}")


#: what ``run.sandbox`` says
SANDBOXED = ("sandboxed: user, PID and mount namespaces of its own (unshare): it saw and could "
             "signal no process of the judge, and all its processes ended with it; the filesystem "
             "was the user's, writable")
NOT_SANDBOXED = ("not sandboxed: the backend's process ran as the same user, with the same view "
                 "of the filesystem and processes")
#: profiles whose inputs are fixed (derandomized): a seed changes nothing there
FIXED_INPUT_PROFILES = ("ci", "triage")
#: variables that would load code into the judging process (``PYTEST_ADDOPTS`` is dropped for
#: the run, :func:`mhaspec.runner.run_in_process`)
PLUGIN_VARIABLES = ("PYTEST_PLUGINS",)


def fixed_inputs(profile: str) -> str | None:
    """What a certificate says instead of a seed for a derandomized ``profile`` (else None)."""
    return f"fixed inputs ({profile} profile)" if profile in FIXED_INPUT_PROFILES else None


def check_seed(profile: str, seed: int | None, pytest_args: list[str]) -> None:
    """Refuse (:class:`UsageError`) a seed (``--seed`` or ``--hypothesis-seed``) with a profile
    whose inputs are fixed: it would have no effect, and the certificate would name a seed that
    chose nothing."""
    given = seed is not None or any(a.split("=")[0] == "--hypothesis-seed" for a in pytest_args)
    if given and profile in FIXED_INPUT_PROFILES:
        raise UsageError(f"--seed has no effect with --profile {profile} ({fixed_inputs(profile)}: "
                         f"derandomized); use --profile certify or dev for seeded inputs")


def check_environment(environ) -> None:
    """Refuse (:class:`UsageError`) to judge with a variable set that loads a plugin into the
    judging process (:data:`PLUGIN_VARIABLES`)."""
    for name in PLUGIN_VARIABLES:
        if environ.get(name):
            raise UsageError(f"{name} is set ({printable(environ[name])[:80]}): it would load code "
                             f"into the judging process; unset it to certify")


def executable(path: str) -> str:
    """``path`` (or a program name on ``PATH``) as an absolute path to an executable file;
    :class:`UsageError` naming ``--backend-python`` otherwise."""
    found = shutil.which(path)
    if found is None:
        raise UsageError(f"--backend-python {printable(path)} is not an executable file")
    return os.path.abspath(found)


def interpreter(backend: sealed.SealedBackend) -> str:
    """What ``run.backend_interpreter`` says: the judge's interpreter or one of its own, with the
    Python version that served the backend (no path of the issuing machine)."""
    python = (backend.process.first.get("host") or {}).get("python", "unknown")
    whose = "its own (--backend-python)" if backend.process.python else "the judge's"
    return f"{whose}: Python {printable(str(python))[:40]}"


def certify(ref: str, *, profile: str = DEFAULT_PROFILE, seed: int | None = None,
            output_dir="certificates", pytest_args: list[str] = (),
            call_timeout: float | None = None, sandbox: bool = False, workers: int = 1,
            backend_python: str | None = None) -> int:
    """Certify backend ``ref``; returns the exit status (0 conforms, 1 otherwise). ``sandbox``:
    run the backend's process in :data:`mhaspec.backend_process.SANDBOX` (a usage error where
    the system cannot); ``workers``: judge in that many pytest-xdist workers, each with a backend
    process of its own (:mod:`mhaspec.sealed_workers`); ``backend_python``: the interpreter that
    serves the backend (its own environment, with the judge's mhaspec; default the judge's)."""
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if backend_python is not None:
        backend_python = executable(backend_python)
    check_environment(os.environ)
    problem = backend_process.sandbox_problem() if sandbox else None
    if problem:
        raise UsageError(f"--sandbox: {problem}")
    check_pytest_args(list(pytest_args))
    check_seed(profile, seed, list(pytest_args))
    guard = JudgeGuard()
    try:
        backend = sealed.open_sealed(ref, call_timeout=call_timeout, sandbox=sandbox,
                                     python=backend_python)
    except sealed.SealedError as exc:
        raise UsageError(printable(one_line(exc), 400)) from None
    backend.process.park()  # no backend process runs while pytest collects the test modules
    try:
        return _certify(backend, ref, profile=profile, seed=seed, output_dir=output_dir,
                        pytest_args=pytest_args, call_timeout=call_timeout, guard=guard,
                        workers=workers)
    finally:
        backend.close()


class JudgeGuard:
    """The judge's own files, guarded (:mod:`mhaspec.judge_files`): made at the start, before the
    backend's process exists, it imports every judge module, refuses an install whose files
    differ from its ``RECORD`` and hashes the judge's files; :meth:`check` raises
    :class:`UsageError` (no certificate) when any differs later."""

    def __init__(self) -> None:
        judge_files.preload()
        bad = judge_files.record_mismatches()
        if bad:
            raise UsageError(f"the installed mhaspec differs from its RECORD ({', '.join(bad[:3])}"
                             f"{', ...' if len(bad) > 3 else ''}): reinstall it before certifying")
        self.record = "editable install: no RECORD hashes" if bad is None else "match RECORD"
        self.before = judge_files.snapshot()
        self.startup = judge_files.startup_code()

    def changed(self) -> str | None:
        """A line naming the judge's files that differ now, or None."""
        files = judge_files.changed(self.before)
        return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "") \
            if files else None

    def check(self, when: str) -> None:
        """:meth:`fail` when the judge's files differ now."""
        found = self.changed()
        if found:
            self.fail(when, found)

    @staticmethod
    def fail(when: str, found: str):
        raise UsageError(f"the judge's files changed while the backend ran ({when}): "
                         f"{printable(found)}; the run cannot be trusted, no certificate written")

    def describe(self, workers: int = 1) -> str:
        where = "" if workers == 1 else f" (and in each of the {workers} workers)"
        return (f"{len(self.before)} judge files hashed before the backend started, unchanged "
                f"after collection{where} and after the run; installed files: {self.record}")


def _certify(backend: sealed.SealedBackend, ref: str, *, profile: str, seed: int | None,
             output_dir, pytest_args, call_timeout: float | None, guard: JudgeGuard,
             workers: int) -> int:
    suite_version = check_suite_version()
    paths = output_paths(output_dir, backend.name)
    check_not_another_backends(paths["json"], ref)
    fixed = fixed_inputs(profile)
    if fixed is None and seed is None:
        seed = random.SystemRandom().randrange(2**32)
    spec = load_spec()
    for folder in ("failures", "passes"):  # an earlier run's cases are not this one's
        for old in sorted(paths[folder].glob("*.npz")):
            old.unlink()
    controller = sealed_workers.Controller(backend, ref) if workers > 1 else None
    args = runner.suite_args(backends=[ref], profile=profile, seed=seed, failures=paths["failures"],
                             passes=paths["passes"], call_timeout=call_timeout,
                             extra=[*(sealed_workers.worker_args(workers) if controller
                                      else NO_WORKERS), *pytest_args])
    print(f"mhaspec certify: {printable(backend.name)} against spec {spec.version}, profile "
          f"{profile}, {fixed or f'seed {seed}'}", flush=True)
    if profile in EXPECT_MINUTES:
        print(f"mhaspec certify: {EXPECT_MINUTES[profile]}", flush=True)
    started = time.monotonic()
    try:
        run = runner.run_in_process(args, backends=[backend], refs={backend.name: ref},
                                    after_collection=guard.changed,
                                    plugins=(controller,) if controller else ())
    except runner.RunError as exc:
        raise UsageError(str(exc)) from None
    seconds = time.monotonic() - started
    if run.after_collection:
        guard.fail("found after collection", run.after_collection)
    if controller:
        in_workers = controller.changed(guard.before)
        if in_workers:  # each worker hashed what it had loaded when its collection ended
            guard.fail("found after collection, in a worker", in_workers)
        lost = controller.unreported()
        if lost:
            raise UsageError(f"a judging worker died during the run ({printable(lost)}): what it "
                             f"judged cannot be trusted, no certificate written")
    backend.close()  # the backend's process and every descendant of it end here
    guard.check("found after the run")
    collector = run.collector
    results = [r for r in collector.results if r["backend"] == backend.name]
    not_run = [r for r in collector.not_run() if r["backend"] == backend.name]
    claimed = collector.claimed()[backend.name]
    clauses = verdicts.clause_verdicts(results, spec, claimed, not_run)
    devices = backend.devices()
    hyp = collector.hypothesis
    body = certificate.body(
        spec=spec, suite_version=suite_version,
        backend=certificate.BackendRecord(
            ref=ref, name=backend.name, framework=backend.framework,
            framework_version=str(backend.framework_version()),
            protocol_version=int(getattr(backend, "protocol_version", 1)),
            capabilities=sorted(backend.capabilities),
            deviations=declared_deviations(backend, claimed),
            capabilities_by_operation=operation_capabilities(backend)),
        devices={d: (backend.device_name(d), claimed[d],
                     {k: str(v) for k, v in backend.precision_flags(d).items()}) for d in claimed},
        unavailable_devices={d: why for d, why in devices.items() if why is not None},
        hypothesis={"profile": hyp["profile"],
                    "seed": None if fixed else _int_or_none(hyp.get("seed")),
                    **({"inputs": fixed} if fixed else {}),
                    "max_examples": hyp["max_examples"], "derandomize": hyp["derandomize"],
                    "phases": hyp["phases"]},
        results=results,
        run={"pytest_args": recorded_args(list(run.args), paths["failures"], paths["passes"]),
             "pytest_exit_status": run.exit_code,
             "selection": collector.selection,
             "call_timeout_s": collector.call_timeout,
             "backend_process": "sealed", "workers": workers,
             "backend_restarts": backend.process.restarts + (controller.restarts()
                                                             if controller else 0),
             "judge_files": guard.describe(workers), "startup_code": guard.startup,
             "sandbox": SANDBOXED if backend.process.sandbox else NOT_SANDBOXED,
             "backend_interpreter": interpreter(backend),
             "tests_run": len(results), "tests_not_run": len(not_run),
             "shrink": "every failure" if collector.shrink_all else "first failure of each cell",
             "seconds": round(seconds, 1)},
        failure_groups=verdicts.failure_groups(results),
        clauses=clauses)
    cert = certificate.seal(body)
    verdict = cert["summary"]["verdict"]
    certificate.verify(cert)
    paths["json"].write_text(json.dumps(cert, indent=1, sort_keys=True, allow_nan=False) + "\n", "utf-8")
    paths["markdown"].write_text(certificate_markdown.to_markdown(cert), "utf-8")
    print(f"mhaspec certify: {printable(backend.name)} {verdict} "
          f"(clauses: {verdicts.describe_counts(clauses, spec.testable_ids)}); tests: "
          f"{len(results)} run, {len(not_run)} not run; {seconds:.1f} s; certificate {paths['json']}")
    return 0 if verdict == verdicts.CONFORMS else 1


def cmd_certify(args) -> int:
    """``mhaspec certify`` with its parsed arguments."""
    return certify(args.backend, profile=args.profile, seed=args.seed, output_dir=args.output_dir,
                   pytest_args=list(args.pytest_args), call_timeout=args.call_timeout,
                   sandbox=args.sandbox, workers=args.workers,
                   backend_python=args.backend_python)
