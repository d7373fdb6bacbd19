"""What a conformance test module uses: run an operation on a cell, judge it, expect the verdict.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

The suite's helpers are split by purpose; this module gathers the names a test calls, so a test
module imports one thing (``from . import harness``):

* running a cell (:mod:`.cell`): :class:`Cell` (backend x device x dtype), :func:`run`,
  :class:`Result`, :func:`fit`, the per-call time limit (:class:`CallTimeout`), :func:`note` (a
  direct call's case, for the condition record);
* judging (:mod:`.judge`): :func:`check` against the float64 oracle under NUM-3 (its parts, or
  any other result judged like an output, through :func:`judge_parts`), :func:`allowance`,
  :func:`reference`, :func:`oracle_result`;
* expecting and reporting (:mod:`.expect`): :func:`expect_oracle`, :func:`expect_close`,
  :func:`expect_rejections`, :func:`reproducer`, the saved failure files;
* the checks a declared behaviour may show in (:mod:`.behaviour_checks`): :func:`attended` (the
  keys a query attends), :func:`expect_blocked_weights_zero`.

What a test did (calls, NUM-3 ratios, cases, its failure) is kept in its record in the pytest
item's stash (:mod:`.item_state`); the plugin (:mod:`.plugin`) reports it.

Stable interface: :func:`run`, :func:`check` and :func:`expect_oracle` keep their signatures.
"""

from __future__ import annotations

from mhaspec.backends.call_limit import CallTimeout
from mhaspec.backends.claim_readers import OPS, cell_deviations, op_capabilities, op_deviations

from .behaviour_checks import attended, expect_blocked_weights_zero
from .cell import Cell, Result, fit, note, remember_call, run
from .expect import (call_problem, expect_close, expect_oracle, expect_rejections,
                     rejection_problem, reproducer)
from .judge import (Check, Reference, allowance, check, float32_hint, judge_parts,
                    lse_for_comparison, lse_scale, magnitude, oracle_result, reference,
                    rows_left_to_mask9, sum_length, unjudged)

__all__ = ["OPS", "CallTimeout", "Cell", "attended", "expect_blocked_weights_zero", "Result", "cell_deviations", "fit", "note", "op_capabilities",
           "op_deviations", "remember_call", "run",
           "call_problem", "expect_close", "expect_oracle", "expect_rejections", "rejection_problem",
           "reproducer",
           "Check", "Reference", "allowance", "check", "float32_hint", "judge_parts",
           "lse_for_comparison", "lse_scale", "magnitude", "oracle_result", "reference",
           "rows_left_to_mask9", "sum_length", "unjudged"]
