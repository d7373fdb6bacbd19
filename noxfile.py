"""Sessions for mhaspec. ``nox -l`` lists them; arguments after ``--`` reach the command run.

One helper (:func:`install`) installs the project with the frameworks a session needs. PyTorch is
installed as the CPU build (``MHASPEC_TORCH``, default ``torch==2.13.0``): an unpinned ``torch`` on
PyPI is a multi-GB CUDA build.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "conformance"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
TORCH = os.environ.get("MHASPEC_TORCH", "torch==2.13.0")
FRAMEWORKS = ("torch", "jax", "tensorflow")


def install(session: nox.Session, *extras: str, groups: tuple[str, ...] = ("test",)) -> None:
    """Install mhaspec (editable) with ``extras`` and the dependency ``groups``."""
    if "torch" in extras:
        session.install(TORCH)
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests: oracle vs mpmath, spec data, strategies, broken backends rejected."""
    install(session)
    session.run("pytest", *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """Run the conformance suite (ci profile) against every in-repo backend on this machine."""
    install(session, *FRAMEWORKS)
    session.run("pytest", "--pyargs", "mhaspec.conformance", "-p", "no:cacheprovider",
                "--mhaspec-profile", os.environ.get("MHASPEC_PROFILE", "ci"), *session.posargs)
