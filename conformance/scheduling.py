"""The order of a run's test items and how pytest-xdist shares them out: one cell at a time.

A cell is one backend on one device in one dtype (:class:`~mhaspec.conformance.harness.Cell`).
pytest collects test by test, each test over every cell; :func:`by_cell` reorders the items
cell by cell (backends in the run's order, each backend's cells together, and within a cell the
tests in the order of their clauses in the spec, collection order among equals). With
pytest-xdist's ``worksteal`` distribution, which :func:`default_dist` makes the default when
workers are asked for without ``--dist``, each worker starts on one contiguous half of that order and an idle worker takes the second half of another's remaining
items, so a cell's tests run in one process, in the order they would alone.

Why: eager JAX compiles each operation once per shape and dtype in each process (about 2,000
compilations per JAX cell, two thirds of its time on the 2-core CI machine), and a compiled
backend (``jax.jit``, ``tf.function``) traces once per shape per process. Spread test by test over
the workers (xdist's ``load``), every worker compiled every shape of every cell; cell by cell, one
does. What runs and how each test is judged do not change: only which process runs an item, and
when. The float64 oracle's results are cached by case (:func:`harness.oracle_result`), which is
what serves the same case in the next cell.
"""

from __future__ import annotations

from typing import Any, Sequence

from .cell import of_item

#: the pytest-xdist distribution used when workers are asked for (``-n``) without ``--dist``
DEFAULT_DIST = "worksteal"


def cell_of(item) -> tuple[str, str, str] | None:
    """(backend, device, dtype) of a conformance test item; None for other items."""
    cell = of_item(item)
    return None if cell is None else (cell.backend.name, cell.device, cell.dtype)


def clause_rank(item, clause_order: dict[str, int]) -> int:
    """The place in the spec of the earliest clause ``item`` names (its ``clause`` markers); after
    every clause when it names none that ``clause_order`` (clause id -> place) knows."""
    marks = item.iter_markers("clause") if hasattr(item, "iter_markers") else ()
    return min((clause_order.get(c, len(clause_order)) for m in marks for c in m.args),
               default=len(clause_order))


def by_cell(items: list, backend_names: list[str], clause_ids: Sequence[str] = ()) -> list:
    """``items`` cell by cell: backends in the order of ``backend_names``, each backend's cells in
    the order they are first collected, items without a cell first; within each cell the order of
    their clauses in ``clause_ids`` (the spec's order: the first failure of a cell, the one shrunk
    and printed first, is then of its most basic failing clause), collection order among equals.
    A deterministic reordering (every xdist worker must collect the same order)."""
    rank = {name: i for i, name in enumerate(backend_names)}
    clause_order = {c: i for i, c in enumerate(clause_ids)}
    first_seen: dict[Any, int] = {}
    for item in items:
        cell = cell_of(item)
        if cell is not None:
            first_seen.setdefault(cell, len(first_seen))

    def key(indexed):
        index, item = indexed
        cell = cell_of(item)
        if cell is None:
            return (-1, 0, index)
        return (rank.get(cell[0], len(rank)), first_seen[cell], clause_rank(item, clause_order),
                index)

    return [item for _, item in sorted(enumerate(items), key=key)]


def default_dist(option) -> None:
    """Choose :data:`DEFAULT_DIST` on ``option`` (pytest's parsed options) when pytest-xdist
    workers are asked for (``-n N``, ``-n auto``) and neither ``--dist`` nor ``-d`` is given;
    otherwise leave it.
    Called before pytest-xdist turns an unset ``--dist`` into ``load``."""
    workers = getattr(option, "numprocesses", None)
    if workers and getattr(option, "dist", None) == "no" and not getattr(option, "distload", False):
        option.dist = DEFAULT_DIST
