"""The digest of the suite's own files, as installed: what a certificate names besides a version.

A git commit identifies the code only in a checkout; an installed copy (``pip install .``, the
wheel) has none. :func:`digest` identifies the code that ran either way: the SHA-256 over the
source and data files of the packages ``mhaspec``, ``mhaspec.spec``, ``mhaspec.backends``,
``mhaspec.conformance`` and ``mhaspec.bench`` where they are imported from, each file as its
package-relative path and contents (bytecode caches left out). Two installs of the same files give
the same digest, editable or not; a changed oracle, test or tolerance changes it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import pathlib

#: the packages whose files make up the suite (pyproject.toml's ``packages``)
PACKAGES = ("mhaspec", "mhaspec.spec", "mhaspec.backends", "mhaspec.conformance", "mhaspec.bench")
#: the files of a package that are part of it (code and the data it reads)
SUFFIXES = (".py", ".toml", ".md", ".json")


def files() -> list[tuple[str, pathlib.Path]]:
    """(``package/relative/path``, file) for every file of the suite, sorted by the first."""
    found = []
    for name in PACKAGES:
        folder = pathlib.Path(importlib.import_module(name).__file__).parent
        found += [(f"{name}/{p.relative_to(folder).as_posix()}", p) for p in folder.iterdir()
                  if p.is_file() and p.suffix in SUFFIXES]
    return sorted(found)


def digest_of(named: list[tuple[str, pathlib.Path]]) -> str:
    """SHA-256 (hex) of ``named`` files: each one's name, length and contents, in the given order."""
    sha = hashlib.sha256()
    for name, path in named:
        data = path.read_bytes()
        sha.update(f"{name}\0{len(data)}\0".encode())
        sha.update(data)
    return sha.hexdigest()


@functools.cache
def digest() -> str:
    """:func:`digest_of` the suite's :func:`files` (computed once per process)."""
    return digest_of(files())
