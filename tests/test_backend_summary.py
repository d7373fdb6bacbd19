"""The terminal summary's line per backend says what was measured, and nothing where nothing ran."""

from __future__ import annotations

import re

from mhaspec import runner


def _summary_lines(tmp_path, backend: str) -> dict[str, str]:
    run = runner.run_subprocess(
        runner.suite_args(backends=[backend], profile="triage", dtypes="float32",
                          extra=["-p", "no:xdist", "-k", "test_sdpa and independent"]),
        cwd=tmp_path, timeout=600)
    return dict(re.findall(r"^([\w.-]+): ((?:CONFORMS|NOT CHECKED|DOES NOT CONFORM|INCOMPLETE).*)$",
                           run.stdout, flags=re.M))


def test_a_backend_that_ran_reports_its_worst_ratio_and_cells(tmp_path):
    line = _summary_lines(tmp_path, "numpy-batched")["numpy-batched"]
    assert re.search(r"worst NUM-3 ratio \d+\.\d\d \([A-Z]+-\d+, K=16\); ran on cpu/float32;", line), line


def test_an_unavailable_backend_reports_no_ratio_and_no_cell(tmp_path):
    line = _summary_lines(tmp_path, "torch-sdpa-flash-cuda")["torch-sdpa-flash-cuda"]
    assert line.startswith("NOT CHECKED"), line
    assert "no NUM-3 ratio measured; ran on nothing;" in line, line
    assert "worst NUM-3 ratio" not in line, line
