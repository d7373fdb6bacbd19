"""``mhaspec certify`` against a backend's process on the judge's machine and user (issue 36).

The backend's process runs at a distance from the judging process but on the same machine as the
same user: it can send huge answers, stop the judge, read its environment or folder, load pytest
plugins, memorise the ``ci`` inputs, edit the installed judge, leave a detached grandchild, ship a
``.pth`` file, or look for the judge in ``/proc``. Each test builds its backend (in
``hostile_certify.BACKENDS``), certifies it in a subprocess and names what the old certify let it
do (docs/certificates.md lists what certify does about each).

Axis legend: none (the subjects are certificates and processes).
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from mhaspec import backend_process

from hostile_certify import HEADS_ONLY, certificate, certify, clause, installed_copy, output
# work: a fixture
from hostile_certify import work  # noqa: F401


def test_an_answer_past_the_cap_fails_that_call_unread(work):
    """Old: any answer up to 4 GiB was read (the judge holding about twice that)."""
    proc = certify(work, "HUGE_ANSWER", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    head1 = clause(certificate(work, "huge-answer"), "HEAD-1")
    assert head1["verdict"] == "fail"
    assert all("at most 256 MiB" in m and "float16" in m for m in head1["failures"]), head1


def test_stopping_the_judge_does_not_stop_its_clock(work):
    """Old: the judge, stopped by SIGSTOP while the backend took 4 s, found the answer waiting
    when continued and passed a call 2.5 times past its limit."""
    proc = certify(work, "STOPS_THE_JUDGE", "--call-timeout", "1.5", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    head1 = clause(certificate(work, "stops-the-judge"), "HEAD-1")
    assert head1["verdict"] == "fail", head1
    assert all("per-call time limit of 1.5 s" in m and "float16" in m
               for m in head1["failures"]), head1["failures"]


def test_the_backend_sees_neither_the_judges_environment_nor_folder_nor_entry(work):
    """Old: the backend's process inherited the judge's environment and working folder and ran
    as ``python -m mhaspec.backend_host``: one ``if`` on any of them told it it was certified
    (issue 36, attack 5). Detection of the host is still possible by other means (its modules,
    its pipes); the certificate and docs/certificates.md say so, and the audit re-run answers it."""
    env_proc = certify(work, "SEES_THE_JUDGE", "--", *HEADS_ONLY, extra_env={"JUDGE_ONLY_SECRET": "1"})
    assert (work / "certs" / "sees-nothing.json").is_file(), (
        sorted(p.name for p in (work / "certs").iterdir()), output(env_proc))
    assert clause(certificate(work, "sees-nothing"), "HEAD-1")["verdict"] == "pass"


FLIP_REPORTS = ("import pytest\n\n@pytest.hookimpl(wrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n"
                "    report = yield\n    report.outcome = 'passed'\n    return report\n")


def test_pytest_plugins_in_the_environment_is_refused(work):
    """Old: ``PYTEST_PLUGINS=flipper`` loaded a plugin into the judging process that turned every
    failure into a pass: a backend wrong in every cell conformed (issue 36, attack 4)."""
    (work / "flipper.py").write_text(FLIP_REPORTS, "utf-8")
    proc = certify(work, "ONLY_IN_HARNESS", "--", *HEADS_ONLY, extra_env={"PYTEST_PLUGINS": "flipper"})
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "PYTEST_PLUGINS" in lines[0], output(proc)
    assert not (work / "certs" / "only-in-harness.json").exists()


def test_a_seed_with_the_fixed_inputs_of_ci_is_refused(work):
    """Old: ``--profile ci --seed 7`` ran the same derandomized inputs as any other seed and the
    certificate named seed 7: a backend that memorised the ci inputs conformed under every seed
    (issue 36, attack 6). Now a seed there is a one-line usage error and a ci certificate says
    "fixed inputs (ci profile)" instead of a seed."""
    for args in (["--seed", "7"], ["--", "--hypothesis-seed=7"]):
        proc = certify(work, "SHIFTING", *args)
        assert proc.returncode == 2, output(proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--seed has no effect with --profile ci" in lines[0], output(proc)
    proc = certify(work, "SHIFTING", "--", *HEADS_ONLY)
    hypothesis = certificate(work, "shifting")["hypothesis"]
    assert hypothesis["seed"] is None and hypothesis["inputs"] == "fixed inputs (ci profile)", output(proc)
    assert "fixed inputs (ci profile)" in (work / "certs" / "shifting.md").read_text("utf-8")


@pytest.mark.parametrize("workers, ref, stem, when", [
    ("1", "EDITS_AND_RESTORES", "edits-and-restores", "found after collection"),
    ("1", "EDITS_THE_JUDGE", "edits-the-judge", "found after collection"),
    ("1", "EDITS_DURING_THE_RUN", "edits-during-the-run", "found after the run"),
    ("2", "EDITS_AND_RESTORES", "edits-and-restores", "found after collection, in a worker"),
    ("2", "EDITS_THE_JUDGE", "edits-the-judge", "found after collection, in a worker"),
    ("2", "EDITS_DURING_THE_RUN", "edits-during-the-run", "found after the run")])
def test_an_edit_of_the_installed_judge_fails_certify_loudly(work, workers, ref, stem, when):
    """Old: the backend's process edited the installed ``conformance/results.py`` before the judge
    imported it (after the claims) and restored it during the run: every outcome a pass, a
    "conforms" with no trace (issue 36, attack 1). Now every judge module is imported and every
    judge file hashed before the backend starts; no backend process runs while pytest collects,
    so an edit made at the start is still there after collection, and one made during the run is
    there after it: a one-line error naming the file, and no certificate. With two workers
    (``--workers 2``) the edit made when the claims are read is in the code a worker loaded: its
    hashes at the end of its collection differ from certify's (restoring it later changes
    nothing)."""
    site = installed_copy(work / ".venv" / "site")
    proc = certify(work, ref, "--workers", workers, "--", *HEADS_ONLY, path=site)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "changed while the backend ran" in lines[0], output(proc)
    assert f"({when})" in lines[0] and "results.py" in lines[0] and "no certificate" in lines[0]
    assert not (work / "certs" / f"{stem}.json").exists()


def test_a_detached_grandchild_does_not_outlive_certify(work):
    """Old: a grandchild of the backend's process (double fork + setsid, outside the process group
    certify kills) lived on and re-sealed a passing certificate after certify exited (issue 36,
    attack 2). Now certify is the subreaper of the backend's descendants and kills every one of
    them before it writes the certificate."""
    import time

    proc = certify(work, "LEAVES_A_GRANDCHILD", "--", *HEADS_ONLY)
    pids = [int(p) for p in (work / "grandchild.pids").read_text("utf-8").split()]
    try:
        time.sleep(3)
        alive = [p for p in pids if running(p)]
        assert pids and not alive, (pids, alive, output(proc))
        assert clause(certificate(work, "leaves-a-grandchild"), "HEAD-1")["verdict"] == "fail"
    finally:
        for p in pids:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_pth_file_that_patches_the_judge_is_named_on_the_certificate(work):
    """Old: a ``.pth`` file in site-packages (which a backend's wheel can ship) ran code in the
    judging process at start-up, patched the judge and left no trace: a backend answering zeros
    passed SDPA-1 (issue 36, attack 3). Python runs it before mhaspec gets control, so certify
    cannot stop it; the certificate now lists every ``.pth`` file that runs code, with its hash
    (``run.startup_code``), and verify prints them."""
    import sysconfig
    import venv

    env_dir = work / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "link.pth").write_text(f"import site; site.addsitedir({ours!r})\n", "utf-8")
    (site / "judge_patch.py").write_text(
        "import sys\n\ndef _hook(event, args):\n"
        "    if event == 'import' and args[0] == 'mhaspec.conformance.harness':\n"
        "        t = sys.modules.get('mhaspec.conformance.tolerance')\n"
        "        if t is not None and not getattr(t, 'patched', False):\n"
        "            t.patched = True\n"
        "            t.judge = lambda *a, **k: t.Comparison(True, 0.0, 1.0, 0.0, 0.0, None)\n\n"
        "sys.addaudithook(_hook)\n", "utf-8")
    (site / "zz_judge_patch.pth").write_text("import judge_patch\n", "utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(work)
    proc = subprocess.run([str(python), "-m", "mhaspec.cli", "certify", "hostile_backends:ZERO",
                           "--profile", "ci", "--output-dir", "certs", "--", "-k",
                           "test_attention_equals_softmax"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    cert = certificate(work, "zero-attention")
    startup = cert["run"]["startup_code"]
    assert any("zz_judge_patch.pth sha256:" in line for line in startup), (startup, output(proc))
    verified = subprocess.run([str(python), "-m", "mhaspec.cli", "verify", "certs/zero-attention.json"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert "zz_judge_patch.pth" in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.skipif(backend_process.sandbox_problem() is not None,
                    reason="no user namespaces here (unshare)")
def test_a_sandboxed_backend_sees_no_process_of_the_judge(work):
    """Unsandboxed, the backend's process finds the judge in /proc (its command line, and so its
    /proc entry: environment, working folder, memory where allowed); with --sandbox it is PID 1 of
    a namespace of its own and sees none, and the certificate says which it was."""
    plain = certify(work, "SEES_PROCESSES", "--", *HEADS_ONLY)
    assert (work / "certs" / "sees-the-judge.json").is_file(), output(plain)
    assert certificate(work, "sees-the-judge")["run"]["sandbox"].startswith("not sandboxed")
    boxed = certify(work, "SEES_PROCESSES", "--sandbox", "--", *HEADS_ONLY)
    assert (work / "certs" / "sees-no-judge.json").is_file(), output(boxed)
    assert certificate(work, "sees-no-judge")["run"]["sandbox"].startswith("sandboxed")
