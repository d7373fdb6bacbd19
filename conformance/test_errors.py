"""Chapter ERR: invalid input raises ValueError naming the argument and the shapes.

The catalogue ``BAD_INPUTS`` (:mod:`~mhaspec.conformance.invalid_inputs`) maps (clause, op) to
invalid calls. Each is built from one valid call by changing one argument; the message must name
that argument (ERR-1) and, where the argument has a shape, print it.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.conformance import harness
from mhaspec.conformance.invalid_inputs import BAD_INPUTS, VALID, invalid_call

pytestmark = pytest.mark.requires("errors")


def _check(cell, op: str, clause: str) -> None:
    problems = []
    for bad in BAD_INPUTS[(clause, op)]:
        harness.note(op, VALID[op], argument=bad.arg.strip("'"))
        try:
            invalid_call(cell, op, bad)
        except ValueError as exc:
            msg = str(exc)
            arg = bad.arg if bad.arg.startswith("'") else f"'{bad.arg}'"
            if arg not in msg:
                problems.append(f"{bad.what}: message does not name argument {arg}: {msg!r}")
            shape = bad.changes.get(bad.arg.strip("'"))
            if isinstance(shape, np.ndarray) and str(shape.shape) not in msg:
                problems.append(f"{bad.what}: message does not show the shape {shape.shape}: {msg!r}")
        except Exception as exc:  # noqa: BLE001 - any other exception type is the finding
            problems.append(f"{bad.what}: raised {type(exc).__name__} instead of ValueError: {exc}")
        else:
            problems.append(f"{bad.what}: accepted (no ValueError)")
    assert not problems, f"[ERR-1, {clause}] {cell.id} {op}:\n  " + "\n  ".join(problems)


@pytest.mark.clause("ERR-1", "ERR-2")
@pytest.mark.requires("mha")
def test_number_of_heads_is_checked(cell):
    _check(cell, "mha", "ERR-2")


@pytest.mark.clause("ERR-1", "ERR-3")
def test_rank_is_checked(cell, op):
    _check(cell, op, "ERR-3")


@pytest.mark.clause("ERR-1", "ERR-4")
def test_batch_and_head_axes_must_match(cell, op):
    _check(cell, op, "ERR-4")


@pytest.mark.clause("ERR-1", "ERR-5")
def test_key_and_value_lengths_must_match(cell, op):
    _check(cell, op, "ERR-5")


@pytest.mark.clause("ERR-1", "ERR-6")
def test_widths_and_parameter_shapes_must_fit(cell, op):
    _check(cell, op, "ERR-6")


@pytest.mark.clause("ERR-1", "ERR-7")
@pytest.mark.requires("masks")
def test_masks_must_be_boolean_and_broadcast(cell, op):
    _check(cell, op, "ERR-7")


@pytest.mark.clause("ERR-1", "ERR-8")
def test_inputs_must_share_one_floating_dtype(cell, op):
    _check(cell, op, "ERR-8")


@pytest.mark.clause("ERR-1", "ERR-9")
@pytest.mark.requires("legacy_mask")
@pytest.mark.dtypes("float16")
def test_legacy_mask_is_rejected_in_float16(cell, op):
    _check(cell, op, "ERR-9")


@pytest.mark.clause("ERR-1", "ERR-10")
def test_scale_must_be_positive_and_finite(cell, op):
    _check(cell, op, "ERR-10")
