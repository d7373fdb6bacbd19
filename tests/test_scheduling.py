"""The suite's item order and default xdist distribution (mhaspec.conformance.scheduling): cell by
cell, tests in collection order within a cell; work stealing when workers are asked for and no
distribution is chosen."""

from __future__ import annotations

import argparse
import subprocess
import sys
from types import SimpleNamespace

from mhaspec.conformance import scheduling
from mhaspec.conformance.harness import Cell


def item(test: str, backend: str | None, device: str = "cpu", dtype: str = "float32",
         clauses: tuple[str, ...] = (), argument: str = "cell"):
    params = {} if backend is None else {argument: Cell(SimpleNamespace(name=backend), device, dtype)}
    marks = [SimpleNamespace(args=(c,)) for c in clauses]
    return SimpleNamespace(name=f"{test}[{backend}-{device}-{dtype}]",
                           callspec=SimpleNamespace(params=params),
                           iter_markers=lambda name: marks if name == "clause" else [])


def test_a_test_naming_its_cell_impl_runs_in_that_cell():
    """``impl``, the former name of the ``cell`` argument, still gives the test its cell."""
    assert scheduling.cell_of(item("t", "np", argument="impl")) == ("np", "cpu", "float32")
    assert scheduling.cell_of(item("t", "np", argument="cell")) == ("np", "cpu", "float32")
    assert scheduling.cell_of(item("t", "np", argument="other")) is None


def names(items) -> list[str]:
    return [i.name for i in items]


def test_items_go_cell_by_cell_in_backend_order_keeping_the_test_order():
    collected = [item(t, b, dtype=d) for t in ("t1", "t2", "t3")
                 for b in ("np", "jax") for d in ("float64", "float32")]
    collected.insert(3, item("plain", None))
    ordered = scheduling.by_cell(collected, ["jax", "np"])
    assert sorted(names(ordered)) == sorted(names(collected))  # a permutation
    assert names(ordered)[0] == "plain[None-cpu-float32]"
    cells = [scheduling.cell_of(i) for i in ordered[1:]]
    assert cells == [("jax", "cpu", "float64")] * 3 + [("jax", "cpu", "float32")] * 3 \
        + [("np", "cpu", "float64")] * 3 + [("np", "cpu", "float32")] * 3
    assert [i.name[:2] for i in ordered[1:4]] == ["t1", "t2", "t3"]


def test_the_order_is_deterministic_and_a_backend_not_listed_goes_last():
    collected = [item(t, b) for t in ("t1", "t2") for b in ("other", "np")]
    once = names(scheduling.by_cell(collected, ["np"]))
    assert once == names(scheduling.by_cell(list(collected), ["np"]))
    assert once == ["t1[np-cpu-float32]", "t2[np-cpu-float32]",
                    "t1[other-cpu-float32]", "t2[other-cpu-float32]"]


def test_within_a_cell_the_tests_follow_the_spec_clause_order():
    collected = [item("numerics", "np", clauses=("NUM-3",)), item("sdpa", "np", clauses=("SDPA-2",)),
                 item("untagged", "np"), item("shapes", "np", clauses=("NUM-1", "SHAPE-1"))]
    ordered = scheduling.by_cell(collected, ["np"], ["SHAPE-1", "SDPA-2", "NUM-1", "NUM-3"])
    assert [i.name.split("[")[0] for i in ordered] == ["shapes", "sdpa", "numerics", "untagged"]


def options(**kw):
    base = dict(numprocesses=None, dist="no", distload=False)
    return argparse.Namespace(**{**base, **kw})


def test_work_stealing_is_the_default_only_when_workers_are_asked_for_without_a_distribution():
    for workers in (2, "auto", "logical"):
        chosen = options(numprocesses=workers)
        scheduling.default_dist(chosen)
        assert chosen.dist == "worksteal"
    for kept in (options(), options(numprocesses=0), options(numprocesses=2, dist="load"),
                 options(numprocesses=2, dist="loadscope"), options(numprocesses=2, distload=True)):
        before = vars(kept).copy()
        scheduling.default_dist(kept)
        assert vars(kept) == before
    scheduling.default_dist(argparse.Namespace())  # without pytest-xdist: nothing to choose


def test_a_run_with_workers_schedules_by_work_stealing_unless_told_otherwise(tmp_path):
    def scheduler(*extra: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--pyargs", "mhaspec.conformance.test_heads",
             "-p", "no:cacheprovider", "--backend", "numpy-batched", "--mhaspec-profile", "triage",
             "--mhaspec-dtypes", "float64", "-v", *extra],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        return next((line for line in out.stdout.splitlines() if "scheduling tests via" in line), "")

    assert "WorkStealingScheduling" in scheduler("-n", "2")
    assert "LoadScheduling" in scheduler("-n", "2", "--dist", "load")
