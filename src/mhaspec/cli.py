"""``mhaspec``: certify a backend, verify a certificate, replay a failure, list backends.

    mhaspec certify NAME|module:attr [--profile certify] [--seed N] [--output-dir DIR]
    mhaspec verify CERT.json
    mhaspec replay FAILURE.npz [--backend NAME|module:attr]
    mhaspec backends

Exit status: 0 success (certify: every claimed clause passes), 1 the backend does not conform or a
replayed case still fails, 2 bad usage or input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import random
import subprocess
import sys
import tempfile

from mhaspec import __version__, certificate


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


def _load(ref: str):
    from mhaspec.backends import BackendLoadError, load_backend

    try:
        return load_backend(ref)
    except BackendLoadError as exc:
        raise UsageError(str(exc)) from None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=pathlib.Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _device_name(backend, device: str) -> str:
    if device == "cpu":
        return platform.processor() or platform.machine()
    try:
        if backend.framework == "torch":
            import torch

            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a name is informative only
        pass
    return device


def cmd_certify(args) -> int:
    from hypothesis import settings

    from mhaspec.spec import load as load_spec

    backend = _load(args.backend)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out_dir = pathlib.Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    failures_dir = out_dir / f"{backend.name}-failures"
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "results.json"
        pytest_args = ["--pyargs", "mhaspec.conformance", "-p", "no:cacheprovider",
                       "--backend", args.backend, "--mhaspec-profile", args.profile,
                       "--mhaspec-report", str(report), "--mhaspec-failures", str(failures_dir),
                       f"--hypothesis-seed={seed}", "-q", "--no-header", *args.pytest_args]
        print(f"mhaspec certify: {backend.name} against spec {load_spec().version}, profile "
              f"{args.profile}, seed {seed}", flush=True)
        import pytest

        code = pytest.main(pytest_args)
        if not report.exists():
            raise UsageError(f"the conformance run did not complete (pytest exit status {int(code)})")
        results = json.loads(report.read_text("utf-8"))
    spec = load_spec()
    devices = backend.devices()
    dtypes = {d: list(backend.dtypes(d)) for d, why in devices.items() if why is None}
    clauses = certificate.clause_verdicts(results, spec, dtypes)
    counts: dict[str, int] = {}
    for c in clauses:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    conforms = not counts.get("fail") and not counts.get("stale-deviation") and bool(counts.get("pass"))
    body = {
        "schema": certificate.SCHEMA_ID,
        "spec": {"name": spec.name, "version": spec.version},
        "suite": {"version": __version__, "git_commit": _git_commit()},
        "backend": {"ref": args.backend, "name": backend.name, "framework": backend.framework,
                    "framework_version": str(backend.framework_version()),
                    "protocol_version": int(getattr(backend, "protocol_version", 1)),
                    "capabilities": sorted(backend.capabilities),
                    "deviations": dict(sorted(backend.deviations.items()))},
        "environment": {
            "python": platform.python_version(), "platform": platform.platform(),
            "devices": {d: {"name": _device_name(backend, d), "dtypes": dtypes[d],
                            "precision_flags": {k: str(v) for k, v in
                                                backend.precision_flags(d).items()}}
                        for d in dtypes},
            "unavailable_devices": {d: why for d, why in devices.items() if why is not None}},
        "hypothesis": {"profile": args.profile, "seed": seed,
                       "max_examples": settings.get_profile(f"mhaspec-{args.profile}").max_examples,
                       "backend_calls": sum(r.get("calls", 0) for r in results),
                       "examples": sum(r.get("examples", 0) for r in results)},
        "issued": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "clauses": clauses,
        "summary": {"verdict": "conforms" if conforms else "does not conform", "counts": counts},
    }
    cert = certificate.seal(body)
    certificate.verify(cert)
    json_path = out_dir / f"{backend.name}.json"
    json_path.write_text(json.dumps(cert, indent=1, sort_keys=True) + "\n", "utf-8")
    (out_dir / f"{backend.name}.md").write_text(certificate.to_markdown(cert), "utf-8")
    print(f"mhaspec certify: {backend.name} {body['summary']['verdict']} "
          f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}); certificate {json_path}")
    return 0 if conforms else 1


def cmd_verify(args) -> int:
    path = pathlib.Path(args.certificate)
    try:
        cert = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read certificate {path}: {exc}") from None
    try:
        certificate.verify(cert)
    except certificate.CertificateError as exc:
        raise UsageError(f"{path}: {exc}") from None
    print(f"{path}: valid certificate for {cert['backend']['name']} "
          f"({cert['summary']['verdict']}, spec {cert['spec']['version']}, sha256 {cert['sha256'][:16]}...)")
    return 0


def cmd_replay(args) -> int:
    from mhaspec.conformance import replay

    try:
        ok = replay.replay_file(args.file, backend=args.backend)
    except replay.ReplayError as exc:
        raise UsageError(str(exc)) from None
    return 0 if ok else 1


def cmd_backends(args) -> int:
    from mhaspec.backends import registered_backends

    for name, target in sorted(registered_backends().items()):
        print(f"{name:16} {target}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mhaspec", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"mhaspec {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("certify", help="run the suite on a backend and write a certificate")
    c.add_argument("backend", help="registered backend name or module:attr")
    c.add_argument("--profile", default="certify", choices=["dev", "ci", "certify"])
    c.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: random)")
    c.add_argument("--output-dir", default="certificates", help="where to write NAME.json and NAME.md")
    c.add_argument("pytest_args", nargs="*", help="extra pytest arguments after --, e.g. -- -n 2")
    c.set_defaults(func=cmd_certify)
    v = sub.add_parser("verify", help="check a certificate's schema and SHA-256")
    v.add_argument("certificate")
    v.set_defaults(func=cmd_verify)
    r = sub.add_parser("replay", help="replay a saved failing case")
    r.add_argument("file", help="a .npz written by a failing conformance run")
    r.add_argument("--backend", default=None, help="backend to replay on (default: the one recorded)")
    r.set_defaults(func=cmd_replay)
    b = sub.add_parser("backends", help="list registered backends")
    b.set_defaults(func=cmd_backends)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # argparse gives a positional nargs="*" nothing after "--" once an option follows the backend
    # (`certify X --profile ci -- -k SDPA`), so the pytest arguments are split off here
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    if "--" in argv:
        argv = argv[:argv.index("--")]
    args = parser().parse_args(argv)
    if extra:
        if args.command != "certify":
            parser().error(f"arguments after '--' are passed to pytest by certify only, not {args.command}")
        args.pytest_args = [*args.pytest_args, *extra]
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"mhaspec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
