"""The command line as a newcomer meets it: a mistyped backend name, a missing framework or extra,
the help texts, a stale install. Each message is one line that says what to do next."""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from mhaspec import certify, cli, usage
from mhaspec.conformance import tolerance, verdicts


def test_certify_refuses_when_the_installed_metadata_names_another_version():
    running = re.escape(certify.__version__)
    with pytest.raises(usage.UsageError, match=rf"version {running} but its installed metadata "
                                               r"says 1\.1\.0: reinstall"):
        certify.check_suite_version("1.1.0")
    assert certify.check_suite_version(certify.__version__) == certify.__version__


def run_cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-1000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_mistyped_backend_name_gets_the_closest_registered_one(tmp_path):
    err = one_line_error(run_cli("certify", "numpy-batchd", "--output-dir", str(tmp_path)))
    assert "did you mean numpy-batched?" in err and "mhaspec backends" in err


def test_a_backend_file_in_the_current_folder_is_found(tmp_path):
    (tmp_path / "mybackend.py").write_text(
        "from mhaspec.backends.np_backend import NumpyBackend\n"
        "BACKEND = NumpyBackend('batched')\nBACKEND.name = 'mine'\n")
    proc = run_cli("certify", "mybackend:BACKEND", "--profile", "dev", "--output-dir", "certs",
                   "--", "-k", "test_shapes and SHAPE", cwd=tmp_path)
    assert "No module named" not in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "certs" / "mine.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_module_that_is_nowhere_says_where_it_is_looked_for(tmp_path):
    err = one_line_error(run_cli("certify", "nowhere_module:BACKEND", cwd=tmp_path))
    assert "run in the folder that holds nowhere_module.py" in err and "PYTHONPATH" in err


#: A ``sitecustomize`` that makes the frameworks unimportable in every process it starts in (the
#: command and the process certify runs the backend in), as in an environment without them.
NO_FRAMEWORKS = ("import sys\n"
                 "for m in ('torch', 'jax', 'tensorflow', 'keras', 'flax', 'transformers', "
                 "'onnxruntime', 'matplotlib'):\n"
                 "    sys.modules[m] = None\n")


def run_without_frameworks(tmp_path, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "no_frameworks"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_FRAMEWORKS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return run_cli(*args, cwd=tmp_path, env=env)


def test_a_registered_backend_without_its_framework_gets_an_install_line(tmp_path):
    err = one_line_error(run_without_frameworks(tmp_path, "certify", "torch-sdpa"))
    assert "needs torch, which is not installed: pip install 'mhaspec[torch]'" in err


def test_conventions_checks_only_backends_whose_framework_imports(tmp_path):
    proc = run_without_frameworks(tmp_path, "conventions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NOT CONFIRMED" not in proc.stdout and "ModuleNotFoundError" not in proc.stdout
    assert "not checked (framework not installed): " in proc.stdout and "torch-mha" in proc.stdout


def test_a_tool_without_matplotlib_names_the_extra(monkeypatch):
    def main(argv):
        import matplotlib  # noqa: F401 - blocked below

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(sys.modules[__name__], "main", main, raising=False)
    monkeypatch.setitem(cli.TOOLS, "plot-tool", (__name__, "a tool that plots"))
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: sys.modules[__name__])
    with pytest.raises(usage.UsageError, match=r"needs the module 'matplotlib', which is not "
                                               r"installed: pip install 'mhaspec\[plots\]'"):
        cli.run_tool("plot-tool", [])


def test_backends_lists_unavailable_frameworks_with_install_lines(tmp_path):
    proc = run_without_frameworks(tmp_path, "backends")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.strip()]
    torch_row = next(r for r in rows if r.startswith("torch-sdpa-efficient-cuda "))
    assert "pip install 'mhaspec[torch]'" in torch_row
    starts = {len(r) - len(r.split("  ", 1)[1].lstrip()) for r in rows}  # the second column
    assert len(starts) == 1, "columns must line up, long names included"


@pytest.mark.parametrize("command", ["certify", "backends", "verify", "replay", "sign"])
def test_every_command_has_a_description(command):
    sub = cli.parser()._subparsers._group_actions[0].choices[command]
    assert sub.description and len(sub.description) > 40


def test_certify_help_states_its_defaults_and_exit_codes():
    text = cli.parser()._subparsers._group_actions[0].choices["certify"].format_help()
    text = " ".join(text.split())
    assert "certify (default)" in text and "default: certificates" in text
    assert "exit status: 0" in text and "1 it does not, 2 bad usage" in text
    for action in cli.parser()._subparsers._group_actions[0].choices["certify"]._actions:
        assert action.help, f"certify {action.option_strings or action.dest} has no help"


def test_the_default_certificate_folder_is_ignored_by_git():
    root = pathlib.Path(__file__).resolve().parents[1]
    assert "/certificates/" in (root / ".gitignore").read_text().split()


def test_ratios_beyond_a_thousand_print_in_scientific_notation():
    assert tolerance.format_ratio(1.0123) == "1.01"
    assert tolerance.format_ratio(1477874627492827.5) == "1.48e+15"


def test_informative_clauses_are_named_so():
    clauses = [{"id": "A-1", "verdict": "pass"}, {"id": "A-2", "verdict": "not-run"},
               {"id": "A-3", "verdict": "not-run"}]
    assert verdicts.describe_counts(clauses, {"A-1", "A-2"}) == "1 informative, 1 not run, 1 pass"


class _Parsed(Exception):
    """Raised in place of parsing: carries the tool's parser."""


@pytest.mark.parametrize("tool", sorted(cli.TOOLS))
def test_every_option_of_every_tool_has_help(tool, monkeypatch):
    def capture(parser, *args, **kwargs):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    module = importlib.import_module(cli.TOOLS[tool][0])
    with pytest.raises(_Parsed) as parsed:
        module.main([])
    parser = parsed.value.args[0]
    assert parser.description, f"mhaspec {tool} has no description"
    missing = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not missing, f"mhaspec {tool}: options without help: {missing}"
