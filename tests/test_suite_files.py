"""What a certificate names the suite's code by when there is no git checkout (an installed
copy): the SHA-256 of the suite's own files (:mod:`mhaspec.suite_files`)."""

from __future__ import annotations

import pathlib
import re

import mhaspec
from mhaspec import certificate, suite_files


def test_the_digest_covers_every_package_of_the_suite_and_its_data():
    names = [name for name, _ in suite_files.files()]
    assert names == sorted(names) and len(set(names)) == len(names)
    for wanted in ("mhaspec/certify.py", "mhaspec/certificate.schema.json", "mhaspec.spec/oracle.py",
                   "mhaspec.spec/clauses.toml", "mhaspec.backends/_base.py",
                   "mhaspec.conformance/tolerance.py", "mhaspec.conformance/test_mha.py",
                   "mhaspec.bench/__main__.py"):
        assert wanted in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert re.fullmatch(r"[0-9a-f]{64}", suite_files.digest())


def test_the_digest_changes_with_any_byte_or_name(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    first = suite_files.digest_of([("p/a.py", a), ("p/b.py", b)])
    assert suite_files.digest_of([("p/a.py", a), ("p/b.py", b)]) == first
    assert suite_files.digest_of([("p/a.py", a), ("p/c.py", b)]) != first
    # the same bytes split differently between two files
    a.write_text("x = 1\ny")
    b.write_text(" = 2\n")
    assert suite_files.digest_of([("p/a.py", a), ("p/b.py", b)]) != first
    a.write_text("x = 2\n")
    b.write_text("y = 2\n")
    assert suite_files.digest_of([("p/a.py", a), ("p/b.py", b)]) != first


def test_a_certificate_without_a_commit_names_the_files_digest():
    digest = "ab" * 32
    assert certificate.suite_identity({"version": "1", "git_commit": "f31b6a3"}) == "commit f31b6a3"
    assert certificate.suite_identity({"version": "1", "git_commit": None,
                                       "files_sha256": digest}) == f"files SHA-256 {digest}"
    assert certificate.suite_identity({"version": "1", "git_commit": None}) == "commit unknown"


def test_the_package_is_typed_and_licensed():
    root = pathlib.Path(__file__).resolve().parents[1]
    assert (pathlib.Path(mhaspec.__file__).parent / "py.typed").is_file()
    assert (root / "LICENSE").read_text("utf-8").lstrip().startswith("Apache License")
