"""The plugin changes nothing in a pytest run that does not ask for mhaspec.

Installed, mhaspec's plugin is loaded into every pytest run of the environment. A foreign project
(its own conftest.py: a Hypothesis profile with 300 examples, loaded; its own ``--backend``) must
run as if mhaspec were not installed: with ``CI=1``, with ``--hypothesis-profile``, with
pytest-xdist workers. A run that asks for mhaspec gets the suite with its ``--mhaspec-`` options,
and the short ``--backend`` / ``--framework`` where no conftest owns them.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from mhaspec import runner
from mhaspec.conformance import activation

SUITE_DIR = pathlib.Path(activation.__file__).parent

CONFTEST_PROFILE = textwrap.dedent('''
    from hypothesis import settings

    settings.register_profile("foreign", max_examples=300)
    settings.register_profile("other", max_examples=77)
    settings.load_profile("foreign")
''')

CONFTEST_OPTION = textwrap.dedent('''
    def pytest_addoption(parser):
        parser.addoption("--backend", default="cpu", help="the foreign project's own option")
''')

TEST_PROFILE = textwrap.dedent('''
    import os

    from hypothesis import settings


    def test_the_projects_own_hypothesis_profile():
        assert settings.get_current_profile_name() == os.environ["EXPECT_PROFILE"]
        assert settings().max_examples == int(os.environ["EXPECT_EXAMPLES"])
''')

TEST_OPTION = textwrap.dedent('''
    import os


    def test_the_projects_own_backend_option(request):
        assert request.config.getoption("--backend") == os.environ["EXPECT_BACKEND"]
''')


def foreign(tmp_path: pathlib.Path, *, option: bool) -> pathlib.Path:
    """A foreign project in ``tmp_path``: its own Hypothesis profile (and ``--backend``)."""
    (tmp_path / "conftest.py").write_text(CONFTEST_PROFILE + (CONFTEST_OPTION if option else ""))
    (tmp_path / "test_profile.py").write_text(TEST_PROFILE)
    (tmp_path / "test_option.py").write_text(TEST_OPTION)
    return tmp_path


def pytest_run(cwd: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """pytest in a subprocess of this interpreter (mhaspec installed), no ``CI`` unless given."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env={**environ, **env}, capture_output=True, text=True,
                          timeout=300)


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize(("args", "env", "profile", "examples"), [
    ((), {}, "foreign", "300"),
    ((), {"CI": "1"}, "foreign", "300"),
    (("--hypothesis-profile", "other"), {}, "other", "77"),
    (("--hypothesis-profile", "other"), {"CI": "1"}, "other", "77"),
    (("-n", "2"), {"CI": "1"}, "foreign", "300"),
], ids=["plain", "CI", "hypothesis-profile", "hypothesis-profile-CI", "xdist-CI"])
def test_a_foreign_project_keeps_its_hypothesis_profile(tmp_path, args, env, profile, examples):
    project = foreign(tmp_path, option=False)
    proc = pytest_run(project, "test_profile.py", *args, EXPECT_PROFILE=profile,
                      EXPECT_EXAMPLES=examples, **env)
    assert proc.returncode == 0, output(proc)


@pytest.mark.parametrize("env", [{}, {"CI": "1"}], ids=["plain", "CI"])
def test_a_foreign_project_keeps_its_own_backend_option(tmp_path, env):
    project = foreign(tmp_path, option=True)
    proc = pytest_run(project, "--backend", "gpu", EXPECT_BACKEND="gpu", EXPECT_PROFILE="foreign",
                      EXPECT_EXAMPLES="300", **env)
    assert proc.returncode == 0, output(proc)
    assert "2 passed" in proc.stdout, output(proc)
    assert pytest_run(project, EXPECT_BACKEND="cpu", EXPECT_PROFILE="foreign",
                      EXPECT_EXAMPLES="300").returncode == 0


def collected(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_a_run_asking_for_mhaspec_beside_a_conftest_owning_backend_takes_the_long_spelling(tmp_path):
    """The foreign ``--backend`` stays the project's; ``--mhaspec-backend`` picks the suite's."""
    project = foreign(tmp_path, option=True)
    proc = pytest_run(project, "test_option.py", "--pyargs", "mhaspec.conformance.test_heads",
                      "--backend", "gpu", "--mhaspec-backend", "numpy-perhead",
                      "--mhaspec-dtypes", "float64", "--mhaspec-profile", "triage",
                      EXPECT_BACKEND="gpu")
    assert proc.returncode == 0, output(proc)
    assert "numpy-perhead" in proc.stdout and "numpy-batched" not in proc.stdout, output(proc)


@pytest.mark.parametrize("selection", [("--backend", "numpy-perhead"),
                                       ("--framework", "numpy", "--backend", "numpy-perhead"),
                                       ("--mhaspec-backend", "numpy-perhead")])
def test_the_short_spellings_select_backends_where_the_plugin_is_active(tmp_path, selection):
    proc = pytest_run(tmp_path, "--pyargs", "mhaspec.conformance.test_heads", *selection,
                      "--collect-only", "-q")
    assert proc.returncode == 0, output(proc)
    items = collected(proc)
    assert items and all("[numpy-perhead-" in item for item in items), output(proc)


def test_no_option_of_the_suite_exists_where_the_plugin_is_inert(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    proc = pytest_run(tmp_path, "test_nothing.py", "--backend", "numpy-batched")
    assert proc.returncode == 4 and "unrecognized arguments: --backend" in proc.stderr, output(proc)
    helped = pytest_run(tmp_path, "--help")
    assert helped.returncode == 0 and "--mhaspec" not in helped.stdout, output(helped)
    suite = pytest_run(tmp_path, "--pyargs", "mhaspec.conformance", "--help")
    assert "--mhaspec-backend" in suite.stdout and "--backend" in suite.stdout, output(suite)


def test_the_runner_builds_the_long_spellings():
    args = runner.suite_args(backends=["numpy-batched", "numpy-perhead"], profile="ci")
    assert args.count("--mhaspec-backend") == 2 and "--backend" not in args


@pytest.mark.parametrize(("args", "tests", "plugins", "cwd", "asks"), [
    ([], [], [], "elsewhere", False),
    (["tests", "-k", "x"], ["tests"], [], "elsewhere", False),
    (["--backend", "cpu"], [], [], "elsewhere", False),
    (["--hypothesis-profile", "ci"], [], [], "elsewhere", False),
    (["--pyargs", "mhaspec.conformance"], ["mhaspec.conformance"], [], "elsewhere", True),
    (["--pyargs", "mhaspec.conformance.test_mha"], ["mhaspec.conformance.test_mha"], [],
     "elsewhere", True),
    (["--pyargs", "mhaspec.conformance_other"], ["mhaspec.conformance_other"], [], "elsewhere",
     False),
    ([], ["{suite}/test_mha.py::test_x"], [], "elsewhere", True),
    ([], ["{suite}"], [], "elsewhere", True),
    ([], [], [], "suite", True),
    (["--mhaspec-profile", "ci"], [], [], "elsewhere", True),
    (["--mhaspec-backend=numpy-batched"], [], [], "elsewhere", True),
    (["-p", "mhaspec"], [], ["mhaspec"], "elsewhere", True),
    (["-p", "mhaspec.conformance.plugin"], [], ["mhaspec.conformance.plugin"], "elsewhere", True),
])
def test_the_rule_of_a_run_asking_for_mhaspec(tmp_path, args, tests, plugins, cwd, asks):
    where = SUITE_DIR if cwd == "suite" else tmp_path
    tests = [t.format(suite=SUITE_DIR) for t in tests]
    assert activation.asks_for_mhaspec(args + tests, test_args=tests, plugins=plugins,
                                       invocation_dir=where, suite_dir=SUITE_DIR) is asks
    assert activation.asks_for_mhaspec([], test_args=[], plugins=[], invocation_dir=tmp_path,
                                       suite_dir=SUITE_DIR, provided=True)
