"""The state of one conformance test: one :class:`ItemState` record in the pytest item's stash.

The plugin creates the record when a test's call starts (``item.stash[ITEM_STATE]``) and makes it
the running one for the call (:func:`running_test`); the suite's code reads it with
:func:`running` (None outside a pytest run), so a test body never passes it around: the cases a
test ran, the backend calls it made, the worst NUM-3 ratio per clause, the value
check's finding, the saved failure's replay line, whether it was shrunk. The plugin writes the
record into the test's report (:mod:`.plugin`). The run's settings (:class:`RunSettings`) are
kept once per run in ``config.stash[SETTINGS_KEY]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import pathlib
from typing import Any, Mapping, NamedTuple

import pytest


class RunSettings(NamedTuple):
    """Settings of one conformance run, kept in ``config.stash[SETTINGS_KEY]`` by the plugin.

    ``failures_dir``: where failing cases are saved (None: not saved); ``passes_dir``: where the
    last case of each passing test is saved (None: not saved); ``backend_refs``: backend
    name -> the reference it was loaded from (for reproducers); ``call_timeout``: seconds one
    backend call may take (None: no limit); ``shapes``: the shapes the strategies draw from (None:
    every size freely, :mod:`.strategies`)."""

    failures_dir: pathlib.Path | None = None
    passes_dir: pathlib.Path | None = None
    backend_refs: Mapping[str, str] = {}
    call_timeout: float | None = None
    shapes: tuple | None = None


SETTINGS_KEY = pytest.StashKey[RunSettings]()


@dataclasses.dataclass(eq=False)
class ItemState:
    """What one test item did, kept in ``item.stash[ITEM_STATE]``.

    ``name``: the item's name (saved failures are named after it); ``clauses``: the clauses it
    names; ``settings``: its run's; ``calls``: backend calls made; ``examples``: Hypothesis
    examples run; ``ratios``: clause -> worst NUM-3 ratio; ``cases``: the (op, CaseSpec) pairs it
    ran (:mod:`.conditions`), with the recorded values the case does not show; ``last_call``: (impl, op, case, overrides) of its last run, saved when
    it fails; ``failure``: what a value check found; ``replay``: the saved failure's replay line;
    ``shrink``: True may shrink, False not shrunk after an earlier failure of its cell, None
    nothing to shrink; ``requirements``: the capabilities it requires (its ``requires`` markers);
    ``sub_cases_left_out``: the sub-cases of capabilities its calls used that the backend does not
    support, ``sub_case_paths``: "capability=library|generic" of the supported ones;
    ``behaviours``: the declared behaviours that showed in it (:mod:`.behaviour_checks`)
    (:mod:`mhaspec.backends.sub_cases`)."""

    name: str = ""
    clauses: frozenset[str] = frozenset()
    settings: RunSettings = RunSettings()
    calls: int = 0
    examples: int = 0
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    cases: set = dataclasses.field(default_factory=set)
    last_call: tuple | None = None
    failure: dict | None = None
    replay: str | None = None
    shrink: bool | None = None
    requirements: frozenset[str] = frozenset()
    sub_cases_left_out: set = dataclasses.field(default_factory=set)
    sub_case_paths: set = dataclasses.field(default_factory=set)
    behaviours: set = dataclasses.field(default_factory=set)

    def record_ratio(self, clause: str, ratio: float) -> None:
        """Keep the worst NUM-3 ratio seen for ``clause``."""
        self.ratios[clause] = max(self.ratios.get(clause, 0.0), ratio)


ITEM_STATE = pytest.StashKey[ItemState]()

_running: contextvars.ContextVar[ItemState | None] = contextvars.ContextVar(
    "mhaspec_running_test", default=None)


def state_of(item: Any) -> ItemState:
    """The record of ``item`` (created with its name, clauses and run settings on first use)."""
    state = item.stash.get(ITEM_STATE, None)
    if state is None:
        state = ItemState(item.name, frozenset(c for m in item.iter_markers("clause") for c in m.args),
                          item.config.stash.get(SETTINGS_KEY, RunSettings()),
                          requirements=frozenset(c for m in item.iter_markers("requires")
                                                 for c in m.args))
        item.stash[ITEM_STATE] = state
    return state


def running() -> ItemState | None:
    """The record of the running test (None outside a pytest run)."""
    return _running.get()


@contextlib.contextmanager
def running_test(state: ItemState):
    """``state`` is the running test's record for the duration of the block."""
    token = _running.set(state)
    try:
        yield state
    finally:
        _running.reset(token)


def running_clauses() -> frozenset[str]:
    """The clauses the running test names (empty outside a pytest run)."""
    state = _running.get()
    return frozenset() if state is None else state.clauses


def running_requirements() -> frozenset[str]:
    """The capabilities the running test requires (empty outside a pytest run)."""
    state = _running.get()
    return frozenset() if state is None else state.requirements


def record_ratio(clause: str, ratio: float) -> None:
    """Keep the worst NUM-3 ratio seen for ``clause`` on the running test (none outside a run)."""
    state = _running.get()
    if state is not None:
        state.record_ratio(clause, ratio)


def run_settings() -> RunSettings:
    """The settings of the running test's session (defaults outside a pytest run)."""
    state = _running.get()
    return RunSettings() if state is None else state.settings


def shape_menu() -> tuple | None:
    """The shapes the running test draws from (None: every size freely, also outside a run)."""
    state = _running.get()
    return None if state is None else state.settings.shapes
