"""The judging process's own code on disk, guarded against the backend's process (same user).

:func:`preload` imports every module the judge runs (the suite's machinery, the spec and its
oracles, the certificate code) before the backend's process starts, so that an edit of an
installed file made later changes nothing already loaded. The conformance test modules are read
by pytest at collection; :func:`snapshot` hashes every file of the mhaspec package and of the
modules the judge has loaded before the backend starts, and :func:`changed` names those that
differ when checked again (after collection and after the run). :func:`record_mismatches` checks
a wheel install against its ``RECORD``. Same-user processes can still race a read (an edit
restored before the next check); docs/certificates.md says what is prevented and what detected.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import pathlib
import pkgutil
import sys
from importlib import metadata

import mhaspec

#: the judge's packages whose every module :func:`preload` imports (test modules excepted)
PRELOADED = ("mhaspec.conformance", "mhaspec.spec")
#: single modules the judge imports after a run (certificate, rendering, verify)
AFTER_RUN = ("mhaspec.certificate", "mhaspec.coverage", "mhaspec.runner", "jsonschema")
#: the third-party packages whose loaded modules are judge code too
THIRD_PARTY = ("pytest", "_pytest", "pluggy", "hypothesis", "numpy", "jsonschema", "mpmath")


def preload() -> int:
    """Import every judge module (:data:`PRELOADED`, :data:`AFTER_RUN`); returns how many
    modules of mhaspec are loaded."""
    for name in AFTER_RUN:
        importlib.import_module(name)
    for package in PRELOADED:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            leaf = info.name.rpartition(".")[2]
            if not (leaf.startswith("test_") or leaf == "__main__"):
                importlib.import_module(info.name)
    return sum(1 for m in sys.modules if m == "mhaspec" or m.startswith("mhaspec."))


def judge_files() -> list[pathlib.Path]:
    """Every ``.py`` file of the mhaspec package folders (the test modules included) and the file
    of every loaded module of :data:`THIRD_PARTY`."""
    folders = {pathlib.Path(p) for p in mhaspec.__path__}
    for name, module in list(sys.modules.items()):
        if name.startswith("mhaspec.") and hasattr(module, "__path__"):
            folders.update(pathlib.Path(p) for p in module.__path__)
    files = {f for folder in folders for f in folder.rglob("*.py") if "__pycache__" not in f.parts}
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and name.split(".")[0] in THIRD_PARTY and origin.endswith(".py"):
            files.add(pathlib.Path(origin))
    return sorted(files)


def digest(path: pathlib.Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable ({type(exc).__name__})"


def snapshot() -> dict[str, str]:
    """File -> SHA-256 of every :func:`judge_files` file."""
    return {str(f): digest(f) for f in judge_files()}


def changed(before: dict[str, str]) -> list[str]:
    """The files of ``before`` whose content differs now (or that are gone)."""
    return sorted(path for path, sha in before.items() if digest(pathlib.Path(path)) != sha)


def record_mismatches(distribution: str = "mhaspec") -> list[str] | None:
    """The files of an installed ``distribution``'s package (``NAME/...``) whose content differs
    from its ``RECORD`` hash; None when RECORD hashes none of them (an editable install)."""
    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        return None
    hashed = [f for f in files if f.hash is not None and str(f).endswith(".py")
              and str(f).startswith(f"{distribution}/")]  # its package, not an editable finder
    if not hashed:
        return None
    bad = []
    for f in hashed:
        path = pathlib.Path(f.locate())
        try:
            got = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, path.read_bytes()).digest())
        except (OSError, ValueError):
            bad.append(str(f))
            continue
        if got.rstrip(b"=").decode() != f.hash.value:
            bad.append(str(f))
    return bad


def startup_code() -> list[str]:
    """What ran code in this process before mhaspec did, as ``path sha256:...`` lines: every
    ``.pth`` file of a site directory with an ``import`` line (Python runs those lines at
    start-up), a loaded ``sitecustomize`` / ``usercustomize``, and every ``hypothesis`` entry point
    (Hypothesis runs them when imported). mhaspec cannot tell a wanted one from a planted one; the
    certificate lists them (``run.startup_code``) for a reader to judge."""
    import site

    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    found = []
    for folder in dict.fromkeys(folders):
        for pth in sorted(pathlib.Path(folder).glob("*.pth")):
            try:
                lines = pth.read_text("utf-8", errors="replace").splitlines()
            except OSError:
                continue
            if any(line.startswith(("import ", "import\t")) for line in lines):
                found.append(f"{pth} sha256:{digest(pth)[:16]}")
    for name in ("sitecustomize", "usercustomize"):
        origin = getattr(sys.modules.get(name), "__file__", None)
        if origin:
            found.append(f"{origin} sha256:{digest(pathlib.Path(origin))[:16]}")
    for ep in metadata.entry_points(group="hypothesis"):
        found.append(f"hypothesis entry point {ep.name} = {ep.value}")
    return found
