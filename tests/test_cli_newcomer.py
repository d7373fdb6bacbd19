"""The command line as a newcomer meets it: a mistyped backend name, a missing framework or extra,
the help texts, a stale install. Each message is one line that says what to do next."""

from __future__ import annotations

import pytest

from mhaspec import certify, usage


def test_certify_refuses_when_the_installed_metadata_names_another_version():
    with pytest.raises(usage.UsageError, match=r"version 1\.2\.0 but its installed metadata says "
                                               r"1\.1\.0: reinstall"):
        certify.check_suite_version("1.1.0")
    assert certify.check_suite_version(certify.__version__) == certify.__version__
