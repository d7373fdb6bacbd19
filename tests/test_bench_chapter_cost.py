"""python -m mhaspec.bench.chapter_cost: a version's new chapters' seconds, per backend, in one run."""

import json

import pytest

from mhaspec.bench import chapter_cost


def _result(backend, clauses, duration):
    """A report's record of one test (the fields every record has, and its duration)."""
    return {"backend": backend, "device": "cpu", "dtype": "float32", "test": "t",
            "outcome": "pass", "clauses": clauses, "duration": duration}


def test_a_test_is_new_only_when_every_clause_it_names_is_new():
    new = frozenset({"GRAD-3", "SINK-1"})
    results = [_result("a", ["GRAD-3"], 2.0), _result("a", ["GRAD-3", "SINK-1"], 1.0),
               _result("a", ["GRAD-1", "GRAD-3"], 4.0), _result("a", ["MASK-1"], 8.0),
               _result("b", ["MASK-1"], 5.0)]
    assert chapter_cost.seconds_by_part(results, new) == {"a": (12.0, 3.0), "b": (5.0, 0.0)}


def test_the_ratio_is_the_whole_over_the_earlier_suite():
    assert chapter_cost.ratio(10.0, 3.0) == pytest.approx(1.3)
    assert chapter_cost.ratio(0.0, 1.0) == float("inf")


def test_the_1_3_clauses_are_those_the_spec_says_were_added_in_1_3():
    new = chapter_cost.new_clauses("1.3")
    assert {"GRAD-3", "GRAD-9", "SINK-1", "SINK-4"} <= new
    assert not new & {"GRAD-1", "GRAD-2", "LSE-1", "MASK-9"}


def test_the_command_prints_the_table_with_the_total(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps([_result("numpy-batched", ["MASK-1"], 10.0),
                                  _result("numpy-batched", ["SINK-1"], 2.5)]))
    assert chapter_cost.main([str(report)]) == 0
    out = capsys.readouterr().out
    assert "| numpy-batched | 10.0 | 2.5 | 1.25 |" in out
    assert "| **all** | 10.0 | 2.5 | 1.25 |" in out


def test_an_empty_report_is_a_one_line_usage_error(tmp_path, capsys):
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(SystemExit) as exit_:
        chapter_cost.main([str(tmp_path / "empty.json")])
    assert exit_.value.code == 2
    assert "report: no results" in capsys.readouterr().err


@pytest.mark.parametrize("text", [None, "not json", '{"a": 1}', '[{"backend": "x"}]'])
def test_a_missing_or_foreign_report_is_a_one_line_usage_error(tmp_path, capsys, text):
    """No traceback for a file that is not a run's report: one line naming the report."""
    report = tmp_path / "report.json"
    if text is not None:
        report.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        chapter_cost.main([str(report)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "report" in err and "Traceback" not in err
