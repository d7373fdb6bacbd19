"""Detached OpenSSH signatures over certificate files (``mhaspec sign``, ``mhaspec verify
--signature``): who issued a certificate, which its digest alone cannot say. Needs ``ssh-keygen``
(OpenSSH 8.1 or later); every failure is a :class:`~mhaspec.certificate.CertificateError`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from mhaspec.certificate import CertificateError

#: The namespace of OpenSSH signatures over certificates (``ssh-keygen -Y sign -n ...``).
SIGNATURE_NAMESPACE = "mhaspec-certificate"


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
