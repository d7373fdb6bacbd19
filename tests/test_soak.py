"""The soak (``mhaspec soak``): rounds, counts, failures, parallel jobs and merging.

Axis legend: none (the soak's results are counts per backend x dtype)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from mhaspec import soak, soak_shards

HERE = pathlib.Path(__file__).parent


def run_soak(tmp_path: pathlib.Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "soak"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mhaspec.soak", "--output-dir", str(out),
                           "--dtypes", "float64", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    return proc, json.loads((out / "summary.json").read_text())


def test_soak_runs_rounds_until_every_cell_reaches_the_target(tmp_path):
    proc, summary = run_soak(tmp_path, "--backend", "numpy-batched", "--backend", "numpy-perhead",
                             "--seconds", "600", "--examples", "200", "--per-test", "2",
                             "--jobs", "2", "--seed", "1", "--", "-k", "test_masking")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cells = summary["by_backend_dtype"]
    assert set(cells) == {"numpy-batched/float64", "numpy-perhead/float64"}
    assert all(c["examples"] >= 200 and c["failures"] == 0 for c in cells.values())
    assert all(c["chapters"] == ["MASK"] for c in cells.values())  # pytest's -k reached the rounds
    assert all(c["calls"] >= c["examples"] // 2 for c in cells.values())
    # 2 examples per test make 78 examples per round of the masking chapter in float64, under
    # the 200 asked for, so each backend needed three rounds (the whole suite makes ~190 a round:
    # the same logic at 5 times the cost)
    rounds = summary["rounds"]
    assert {r["backend"] for r in rounds} == {"numpy-batched", "numpy-perhead"}
    assert len(rounds) >= 4 and len({r["seed"] for r in rounds}) == len(rounds)
    assert summary["examples_per_test"] == 2 and summary["jobs"] == 2
    examples, calls = (sum(c[f] for c in cells.values()) for f in ("examples", "calls"))
    assert (f"**{examples:,} Hypothesis examples, {calls:,} backend calls, 0 failures**"
            in soak.markdown(summary))
    # which code ran, on the console when the soak starts and in the table's header
    suite = soak_shards.suite_text(summary["suite"])
    assert suite.startswith("mhaspec ") and "files SHA-256 " in suite
    assert f"soak: suite {suite}\n" in proc.stdout and f"Suite: {suite}." in soak.markdown(summary)


def test_soak_reports_a_wrong_backend_with_its_seed_and_exit_status_1(tmp_path):
    proc, summary = run_soak(tmp_path, "--backend", "broken_backends:WRONG_SCALE", "--seconds",
                             "600", "--examples", "1", "--per-test", "3", "--", "-x")
    assert proc.returncode == 1
    assert summary["failures"], summary
    failure = summary["failures"][0]
    assert failure["backend"] == "broken-wrong-scale" and failure["outcome"] == "fail"
    assert failure["seed"] == summary["rounds"][0]["seed"]
    assert "FAILURE round 1" in proc.stdout


def test_merge_adds_counts_and_keeps_every_failure():
    def one(examples, calls, failures):
        return {"command": ["x"], "backends": ["b"], "profile": "certify", "shapes": "menu",
                "seconds_budget": 10, "target_examples": 100, "rounds": [{"round": 1}],
                "failures": [{"round": 1, "seed": 7, "backend": "b", "dtype": "float64",
                              "test": "t", "clauses": ["NUM-3"]}] * failures,
                "by_backend_dtype": {"b/float64": {"backend": "b", "dtype": "float64",
                                                   "examples": examples, "calls": calls,
                                                   "tests": 3,
                                                   "failures": failures}},
                "elapsed_s": calls / 10}
    merged = soak.merge([one(55, 60, 0), one(50, 50, 1)])
    cell = merged["by_backend_dtype"]["b/float64"]
    assert (cell["examples"], cell["calls"], cell["tests"], cell["failures"]) == (105, 110, 6, 1)
    assert len(merged["failures"]) == 1 and len(merged["rounds"]) == 2
    assert merged["elapsed_s"] == 6.0 and merged["merged_from"] == 2
    text = soak.markdown(merged)
    assert "**105 Hypothesis examples, 110 backend calls, 1 failures**" in text
    assert "stopped below" not in text


def test_the_table_says_which_chapters_of_the_spec_ran_in_each_cell():
    chapters = soak.testable_chapters()
    assert {"SHAPE", "MASK", "GQA", "LSE"} <= set(chapters)  # 1.1's chapters and 1.2's
    summary = {"elapsed_s": 1.0, "rounds": [], "profile": "certify", "failures": [],
               "target_examples": 1, "spec_version": "1.2", "chapters": chapters,
               "by_backend_dtype": {}, "command": ["mhaspec", "soak"], "backends": ["b"]}
    results = [{"backend": "b", "dtype": "float64", "device": "cpu", "outcome": outcome,
                "clauses": [clause], "examples": 5, "calls": 5}
               for clause, outcome in (("MASK-9", "pass"), ("LSE-1", "not-implemented"),
                                       ("SHAPE-1", "deviation"))]
    soak._accumulate(summary, {"interrupted": True, "results": results, "seed": 1,
                               "returncode": 0}, 1, "b")
    assert summary["by_backend_dtype"]["b/float64"]["chapters"] == ["MASK", "SHAPE"]
    row = [line for line in soak.markdown(summary).split("\n") if line.startswith("| b |")][0]
    missing = [ch for ch in chapters if ch not in ("MASK", "SHAPE")]
    assert row.endswith(f"| 2 of {len(chapters)} (not {', '.join(missing)}) |"), row
    other = {**summary, "rounds": [{**summary["rounds"][0], "seed": 2}]}  # another round seed
    merged = soak.merge([summary, other])
    assert merged["by_backend_dtype"]["b/float64"]["chapters"] == ["MASK", "SHAPE"]


def test_merge_of_soaks_run_one_after_another_adds_their_times_and_keeps_each_target():
    def one(backend, target, per_test, examples, elapsed):
        return {"command": ["x"], "backends": [backend], "profile": "certify", "shapes": "menu",
                "target_examples": target, "examples_per_test": per_test, "rounds": [{"round": 1}],
                "failures": [], "elapsed_s": elapsed,
                "by_backend_dtype": {f"{backend}/float32": {
                    "backend": backend, "dtype": "float32", "examples": examples, "calls": examples,
                    "tests": 3, "failures": 0}}}
    soaks = [one("a", 20_000, 200, 21_000, 100.0), one("j", 5_000, 50, 4_000, 30.0)]
    merged = soak.merge(soaks, one_after_another=True)
    assert merged["elapsed_s"] == 130.0 and merged["examples_per_test"] == [50, 200]
    assert merged["target_examples"] == 20_000
    assert [c["target"] for c in merged["by_backend_dtype"].values()] == [20_000, 5_000]
    text = soak.markdown(merged)
    assert "(130 s in 2 soaks one after another" in text and "50 to 200 examples per test" in text
    assert "target 20,000 examples per backend x dtype (5,000 for j/float32)" in text
    assert "1 backend x dtype cells stopped below the target" in text and "j/float32." in text
    assert soak.merge(soaks)["elapsed_s"] == 100.0  # side by side: the longest
    # a merged summary merges again (it lists its soaks' examples per test): soaks added later
    again = soak.merge([merged, one("k", 20_000, 25, 20_500, 10.0)], one_after_another=True)
    assert again["examples_per_test"] == [25, 50, 200] and again["elapsed_s"] == 140.0
    assert [c["examples"] for c in again["by_backend_dtype"].values()] == [21_000, 4_000, 20_500]


def test_sigterm_stops_a_background_soak_as_ctrl_c_does(tmp_path):
    """A soak started with SIGINT ignored (``nohup``, ``&`` in a script) stops on SIGTERM: its
    running round is interrupted, what ran is kept, the summary written, no round left behind."""
    out = tmp_path / "soak"
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen([sys.executable, "-m", "mhaspec.soak", "--output-dir", str(out),
                             "--backend", "numpy-batched", "--dtypes", "float64", "--seconds",
                             "600", "--examples", "1000000", "--per-test", "100", "--seed", "3"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=ignore_sigint)
    assert proc.stdout.readline().startswith("soak: suite mhaspec ")
    assert proc.stdout.readline().startswith("soak round 1: numpy-batched")
    log = out / "round-001.log"
    deadline = time.monotonic() + 120
    while b"tests" not in (log.read_bytes() if log.exists() else b"") and time.monotonic() < deadline:
        time.sleep(0.2)  # the round's pytest has started running tests
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, rest[-2000:]
    assert "soak: interrupted; collecting the running rounds' results" in rest
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and [r["interrupted"] for r in summary["rounds"]] == [True]
    report = str(out / "round-001.json")
    left = [p for p in pathlib.Path("/proc").glob("[0-9]*") if _cmdline_has(p, report)]
    assert not left, "the interrupted round is still running"


def _cmdline_has(proc_dir: pathlib.Path, text: str) -> bool:
    try:
        return text in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
