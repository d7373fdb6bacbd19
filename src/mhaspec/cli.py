"""``mhaspec``: the command line of the conformance suite.

    mhaspec certify NAME|module:attr [--profile certify] [--seed N] [--workers N]
                    [--backend-python PYTHON] [--output-dir DIR]
    mhaspec verify CERT.json [--markdown CERT.md]
                   [--signature CERT.json.sig --allowed-signers FILE --identity ID]
    mhaspec sign CERT.json --key KEY [--force]
    mhaspec replay FAILURE.npz --backend NAME|module:attr | --recorded-backend [--max-bytes N]
    mhaspec backends
    mhaspec matrix | scoreboard | soak | bench | tolerance-study | errors-table | conventions | audit [ARGS]

Exit status: 0 success (certify: every claimed clause passes), 1 the backend does not conform or a
replayed case still fails, 2 bad usage or input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys

from mhaspec import __version__, certificate, certificate_markdown, certificate_signature, coverage
from mhaspec import backends
from mhaspec.usage import (ArgumentParser, UsageError, checked_backend, install_hint, one_line,
                           printable, read_bounded)

#: ``mhaspec <command>`` -> (module whose ``main(argv) -> int`` runs it, one-line help). Imported
#: only when the command runs, so one tool's missing optional dependency is that tool's error.
TOOLS = {
    "matrix": ("mhaspec.matrix", "conformance matrix of every registered backend"),
    "scoreboard": ("mhaspec.scoreboard", "the ecosystem table from the certificates (+ image)"),
    "soak": ("mhaspec.soak", "run the suite for hours and collect rare failures"),
    "bench": ("mhaspec.bench.__main__", "speed and memory of the backends, side by side"),
    "tolerance-study": ("mhaspec.tolerance_study", "measure NUM-3 error ratios over many cases"),
    "errors-table": ("mhaspec.errors_table", "the table of invalid inputs and their errors"),
    "conventions": ("mhaspec.conventions", "check the native ops' translated conventions"),
    "audit": ("mhaspec.audit", "re-run a sample of a certificate's clauses with your seed"),
}


def cmd_certify(args) -> int:
    from mhaspec.certify import cmd_certify as certify

    return certify(args)


def _read_certificate(path: pathlib.Path, max_bytes: int) -> tuple[bytes, dict]:
    """The file's bytes and its parsed JSON (schema and digest checked)."""
    data = read_bounded(path, max_bytes, "certificate")
    try:
        cert = certificate.loads(data)
    except certificate.CertificateError as exc:
        raise UsageError(f"cannot read certificate {printable(path)}: {one_line(exc)}") from None
    try:
        cert = certificate.verify(cert)
    except certificate.CertificateError as exc:
        raise UsageError(f"{printable(path)}: {printable(one_line(exc), limit=400)}") from None
    return data, cert


def cmd_verify(args) -> int:
    path = pathlib.Path(args.certificate)
    signing = (args.signature, args.allowed_signers, args.identity)
    if any(signing) and not all(signing):
        raise UsageError("--signature, --allowed-signers and --identity go together")
    data, cert = _read_certificate(path, args.max_bytes)
    try:
        checked = certificate.check_consistency(cert)
    except certificate.CertificateError as exc:
        raise UsageError(f"{printable(path)}: inconsistent certificate: "
                         f"{printable(one_line(exc), limit=400)}") from None
    b = cert["backend"]
    lines = [f"{printable(path)}: certificate for {printable(b['name'])} ({printable(b['framework'])} "
             f"{printable(b['framework_version'])}): {coverage.headline(cert)}",
             f"covers: {coverage.summary(coverage.of(cert))}; claimed capabilities: "
             f"{printable(', '.join(b.get('capabilities', [])) or 'none')}",
             f"schema: matches {certificate.SCHEMA_ID}",
             f"integrity: the body hashes to the recorded SHA-256 {cert['sha256']}", *checked]
    if args.markdown:
        md = pathlib.Path(args.markdown)
        try:
            text = read_bounded(md, args.max_bytes, "Markdown file").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"cannot read {printable(md)}: {one_line(exc)}") from None
        if text != certificate_markdown.to_markdown(cert):
            raise UsageError(f"{printable(md)} is not the Markdown rendering of {printable(path)}")
        lines.append(f"markdown: {printable(md)} is the rendering of the JSON")
    if args.signature:
        try:
            said = certificate_signature.check_signature(
                data, pathlib.Path(args.signature), pathlib.Path(args.allowed_signers),
                args.identity)
        except certificate.CertificateError as exc:
            raise UsageError(f"{printable(args.signature)}: "
                             f"{printable(one_line(exc), limit=400)}") from None
        lines.append(f"authenticity: signed by {printable(args.identity)} with a key listed in "
                     f"{printable(args.allowed_signers)} ({printable(said)})")
    else:
        lines.append("authenticity: NOT checked (no --signature): anyone can write a certificate "
                     "that passes the checks above")
    print("\n".join(lines))
    return 0


def cmd_sign(args) -> int:
    path = pathlib.Path(args.certificate)
    _, cert = _read_certificate(path, certificate.MAX_BYTES)
    sig = certificate_signature.signature_path(path)
    existed = os.path.lexists(sig)
    if existed and (sig.is_dir() and not sig.is_symlink()):
        raise UsageError(f"signature path {printable(sig)} is a directory")
    if existed and not args.force:
        raise UsageError(f"{printable(sig)} exists and was left as it is: --force replaces it")
    try:
        certificate.check_consistency(cert)
        if existed:
            sig.unlink()  # ssh-keygen would keep the old signature; a symlink is removed, not followed
        certificate_signature.sign(path, pathlib.Path(args.key))
    except certificate.CertificateError as exc:
        raise UsageError(f"{printable(path)}: {printable(one_line(exc), limit=400)}") from None
    except OSError as exc:
        raise UsageError(f"cannot replace {printable(sig)}: {one_line(exc.strerror or exc)}") from None
    print(f"{printable(path)}: signed, signature {printable(sig)} "
          f"{'replaced the previous one' if existed else 'written'} (namespace "
          f"{certificate_signature.SIGNATURE_NAMESPACE})")
    return 0


def cmd_replay(args) -> int:
    from mhaspec.replay import replay_file

    return replay_file(args.file, backend=args.backend, recorded_backend=args.recorded_backend,
                       max_bytes=args.max_bytes)


def cmd_backends(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up log, not a reason
    rows = sorted(backends.registered_backends().items())
    name_width = max((len(printable(n)) for n, _ in rows), default=0)
    target_width = max((len(printable(t)) for _, t in rows), default=0)
    for name, target in rows:
        try:
            backend = checked_backend(name)
            offered = backend.devices()
            devices = {d: list(backend.dtypes(d)) for d, why in offered.items() if why is None}
            state = ("available " + "; ".join(f"{d}: {', '.join(t)}" for d, t in devices.items())
                     if devices else "unavailable: " + "; ".join(f"{d}: {printable(why, limit=80)}"
                                                                  for d, why in offered.items()))
        except UsageError as exc:
            state = f"unavailable: {printable(exc, limit=160)}"
        except Exception as exc:  # noqa: BLE001 - devices() or dtypes() of a broken backend
            state = f"unavailable: {type(exc).__name__}: {printable(one_line(exc), limit=160)}"
        print(f"{printable(name):{name_width}}  {printable(target):{target_width}}  {state}")
    return 0


def _byte_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    from mhaspec.conformance.failure_file import DEFAULT_MAX_BYTES

    p = ArgumentParser(prog="mhaspec", description="The command line of the mhaspec conformance suite.",
                       epilog="exit status: 0 success (certify: the backend conforms), 1 the "
                              "backend does not conform or a replayed case still fails, 2 bad "
                              "usage or input (one line on stderr). mhaspec COMMAND --help "
                              "describes each command.")
    p.add_argument("--version", action="version", version=f"mhaspec {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("certify", help="run the suite on a backend and write a certificate",
                       description="Run the whole conformance suite on one backend and write "
                                   "its certificate: the suite judges in this process (or, with "
                                   "--workers N, in N pytest-xdist workers), the backend runs "
                                   "in a process of its own (one per worker). Writes NAME.json (what ran and "
                                   "the verdict of every clause) and its rendering NAME.md, and "
                                   "every failing case as NAME-failures/<test>.npz for mhaspec "
                                   "replay, and the last case of every passing test as "
                                   "NAME-passes/<test>.npz (a sample others can replay).",
                       epilog="exit status: 0 the backend conforms (every claimed clause passes "
                              "or is a declared deviation), 1 it does not, 2 bad usage (one line "
                              "on stderr). The default --output-dir certificates/ is in "
                              ".gitignore; mhaspec scoreboard reads the published certificates "
                              "in docs/certificates/.")
    c.add_argument("backend", metavar="NAME|module:attr",
                   help="a registered backend name (mhaspec backends lists them) or module:attr, "
                        "the module found on the Python path or in the current folder")
    c.add_argument("--profile", default="certify", choices=["dev", "ci", "certify"],
                   help="Hypothesis profile: certify (default) 100 examples per test, random "
                        "seed; ci the fixed derandomized examples CI runs, faster; dev a quick "
                        "random look")
    c.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: random, "
                                                          "recorded in the certificate; refused "
                                                          "with --profile ci, whose inputs are "
                                                          "fixed)")
    c.add_argument("--sandbox", action="store_true",
                   help="run the backend's process in user, PID and mount namespaces of its own "
                        "(unshare; recorded in the certificate's run.sandbox)")
    c.add_argument("--backend-python", default=None, metavar="PYTHON",
                   help="the interpreter that serves the backend, e.g. the python of the "
                        "backend's own virtual environment (it needs this mhaspec version "
                        "installed); the judge's environment then needs no framework (default: "
                        "the judge's interpreter); recorded in the certificate")
    c.add_argument("--workers", type=int, default=1, metavar="N",
                   help="judge in N pytest-xdist worker processes, each with its own sealed "
                        "backend process (default 1: one judging process); recorded in the "
                        "certificate")
    c.add_argument("--output-dir", default="certificates",
                   help="where to write NAME.json, NAME.md, NAME-failures/ and NAME-passes/ "
                        "(default: "
                        "certificates; NAME: the backend's name reduced to a safe file name)")
    c.add_argument("--call-timeout", type=float, default=None, metavar="SECONDS",
                   help="time limit of every backend call; past it the test fails (default: the "
                        "suite's, 60 s); recorded in the certificate")
    c.add_argument("pytest_args", nargs="*",
                   help="extra pytest arguments after --, e.g. -- -k MASK-1 (a selection is "
                        "recorded in the certificate; -n, --dist and -p are refused)")
    c.set_defaults(func=cmd_certify)
    v = sub.add_parser("verify", help="check a certificate's integrity and consistency "
                                      "(and its signature when given)",
                       description="Check a certificate and print each check: schema, integrity "
                                   "(the body hashes to the recorded SHA-256), consistency (the "
                                   "summary follows from the clauses, which are those of a known "
                                   "spec version), the Markdown rendering with --markdown, and "
                                   "authenticity only with a signature from a key you trust.")
    v.add_argument("certificate", help="the certificate's JSON file")
    v.add_argument("--markdown", help="also check that this file is the Markdown rendering of the JSON")
    v.add_argument("--signature", help="a detached OpenSSH signature of the certificate (mhaspec sign)")
    v.add_argument("--allowed-signers", help="ssh-keygen allowed_signers file of the keys you trust")
    v.add_argument("--identity", help="the signer's identity in the allowed_signers file")
    v.add_argument("--max-bytes", type=_byte_count, default=certificate.MAX_BYTES,
                   help=f"largest certificate read (default {certificate.MAX_BYTES})")
    v.set_defaults(func=cmd_verify)
    s = sub.add_parser("sign", help="sign a certificate with an OpenSSH key (ssh-keygen -Y sign)",
                       description="Check a certificate's integrity and consistency, then write "
                                   "the detached signature CERT.sig (namespace "
                                   f"{certificate_signature.SIGNATURE_NAMESPACE}).")
    s.add_argument("certificate", help="the certificate's JSON file")
    s.add_argument("--key", required=True, help="OpenSSH private key file (ssh-keygen -t ed25519)")
    s.add_argument("--force", action="store_true", help="replace an existing CERT.sig")
    s.set_defaults(func=cmd_sign)
    r = sub.add_parser("replay", help="replay a saved failing case on a backend you name",
                       description="Rerun a saved failing case and print its error against the "
                                   "oracle (exit 0 conforms now, 1 still fails). The file is data: "
                                   "it is checked before its arrays are read and never chooses "
                                   "the code that runs.")
    r.add_argument("file", help="a .npz written by a failing conformance run")
    which = r.add_mutually_exclusive_group()
    which.add_argument("--backend", default=None,
                       help="backend to replay on: registered name or module:attr")
    which.add_argument("--recorded-backend", action="store_true",
                       help="replay on the backend the file records, if it is a registered "
                            "name (a module:attr from a file is never imported)")
    r.add_argument("--max-bytes", type=_byte_count, default=DEFAULT_MAX_BYTES,
                   help=f"largest total size of the file's arrays (default {DEFAULT_MAX_BYTES})")
    r.set_defaults(func=cmd_replay)
    b = sub.add_parser("backends", help="list registered backends and whether each is available",
                       description="List the backends registered in the mhaspec.backends "
                                   "entry-point group: name, module:attr, and either the devices "
                                   "and dtypes it offers here or why it is unavailable (with the "
                                   "install line when its framework is missing).",
                       epilog="exit status: 0")
    b.set_defaults(func=cmd_backends)
    for name, (_, text) in TOOLS.items():  # their own --help describes them
        sub.add_parser(name, help=f"{text} (mhaspec {name} --help)", add_help=False)
    return p


def run_tool(name: str, argv: list[str]) -> int:
    """Run ``mhaspec <name>`` (one of :data:`TOOLS`): its module's ``main(argv)``."""
    module_name = TOOLS[name][0]
    try:
        main_of = importlib.import_module(module_name).main
        return int(main_of(argv) or 0)
    except ModuleNotFoundError as exc:
        raise UsageError(f"mhaspec {name} needs the module {exc.name!r}, which is not "
                         f"installed{install_hint(exc.name)}") from None
    except AttributeError:
        raise UsageError(f"mhaspec {name}: {module_name} has no main(argv)") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in TOOLS:
            return run_tool(argv[0], argv[1:])
        # argparse gives a positional nargs="*" nothing after "--" once an option follows the
        # backend (`certify X --profile ci -- -k SDPA`), so the pytest arguments are split off here
        extra = argv[argv.index("--") + 1:] if "--" in argv else []
        if "--" in argv:
            argv = argv[:argv.index("--")]
        args = parser().parse_args(argv)
        if extra:
            if args.command != "certify":
                raise UsageError(f"arguments after '--' are passed to pytest by certify only, "
                                 f"not {args.command}")
            args.pytest_args = [*args.pytest_args, *extra]
        return args.func(args)
    except UsageError as exc:
        print(f"mhaspec: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`mhaspec verify ... | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
