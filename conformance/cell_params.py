"""The cells a conformance test runs in: its ``cell`` parameters, backend x device x dtype (x
``op``), each with the marks that make skips and deviations data (:func:`cell_params`): an
unclaimed capability is skipped as "not implemented", an absent device is skipped with its reason,
and a clause the backend declares a deviation from is ``xfail(strict=True)`` (:data:`DECLARED`).
A backend may scope capabilities and deviations to one operation (``capabilities_for(op)``,
``"CLAUSE@op"`` keys; :func:`~mhaspec.backends.claim_readers.op_capabilities`).
"""

from __future__ import annotations

import pytest

from mhaspec.backends.claim_readers import cell_deviations, op_capabilities, op_deviations

from . import cell
from .results import COLLECTOR_KEY, NOT_IMPLEMENTED

#: how the reason of the suite's own xfail mark, a declared deviation, starts
DECLARED = "declared deviation: "


def operation_of(op: str | None, needs: set[str]) -> str | None:
    """The operation a test exercises, for per-operation scoping: its ``op`` parameter, else the
    one of "mha" / "sdpa" it requires (None for neither)."""
    return op or next((o for o in ("mha", "sdpa") if o in needs), None)


def _scoped(backend, op: str | None) -> frozenset:
    """:func:`~mhaspec.backends.claim_readers.op_capabilities`, refused when it claims more than
    ``capabilities``."""
    scoped = op_capabilities(backend, op)
    extra = sorted(scoped - set(backend.capabilities))
    if extra:
        raise pytest.UsageError(f"backend {backend.name}: capabilities_for({op!r}) claims {extra}, "
                                f"which its capabilities (every operation's together) lack")
    return scoped


def cell_params(metafunc: pytest.Metafunc, backends: list, op: str | None = None) -> list:
    """The ``cell`` parameters (with ``op`` when given) of the test ``metafunc`` over ``backends``,
    each with its skip or xfail mark; a cell ``--mhaspec-dtypes`` leaves out is recorded as not
    run."""
    clauses = [c for m in metafunc.definition.iter_markers("clause") for c in m.args]
    needs = {c for m in metafunc.definition.iter_markers("requires") for c in m.args}
    needs |= {op} if op else set()
    scope = operation_of(op, needs)
    only = {d for m in metafunc.definition.iter_markers("dtypes") for d in m.args}
    chosen = metafunc.config.getoption("--mhaspec-dtypes")
    chosen = set(chosen.split(",")) if chosen else None
    collector = metafunc.config.stash[COLLECTOR_KEY]
    params = []
    for backend in backends:
        missing = sorted(needs - _scoped(backend, scope))
        for device, unavailable in backend.devices().items():
            dtypes = backend.dtypes(device) if unavailable is None else ("float32",)
            for dtype in dtypes:
                deviations = op_deviations(cell_deviations(backend, device, dtype),
                                                     scope)
                declared = [c for c in clauses if c in deviations]
                if only and dtype not in only:
                    continue
                if chosen and dtype not in chosen:
                    if clauses and unavailable is None and not missing:
                        collector.add_not_run({
                            "backend": backend.name, "device": device, "dtype": dtype,
                            "clauses": clauses, "why": "--mhaspec-dtypes",
                            "test": f"{metafunc.definition.name}[{op or ''}]"})
                    continue
                marks = []
                if unavailable is not None:
                    marks.append(pytest.mark.skip(reason=f"device unavailable: {unavailable}"))
                elif missing:
                    marks.append(pytest.mark.skip(
                        reason=f"{NOT_IMPLEMENTED}: {backend.name} does not claim {missing}"
                               + (f" for {scope}" if set(missing) <= set(backend.capabilities) else "")))
                elif declared:
                    marks.append(pytest.mark.xfail(
                        strict=True, reason=DECLARED + "; ".join(
                            f"{c}: {deviations[c]}" for c in declared)))
                impl = cell.Cell(backend, device, dtype)
                if op is None:
                    params.append(pytest.param(impl, id=impl.id, marks=marks))
                else:
                    params.append(pytest.param(impl, op, id=f"{impl.id}-{op}", marks=marks))
    return params
