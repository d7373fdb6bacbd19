"""Spec 1.4's serving step for array backends: merging partial attention states (MERGE).

Axis legend: B batch, h heads, L_q queries, d_v value width, n states merged, T = B * L_q query
tokens (the ``"tokens"`` lse layout).

:func:`merge_states` validates a call (MERGE-6) and merges over the array primitives of
:class:`~.primitives.Ops` (``ops``: a framework's operations, an
:class:`~._generic.ArrayBackend`'s ``ops``), so every framework shares it: the states' lses are stacked on a
last axis and reduced with their maximum subtracted, a row whose every lse is -inf keeps weight 0
(no ``-inf - -inf``), and a sink is one more term with no value (MERGE-4). float16 and bfloat16
states are merged in float32 and the result rounded once, as the peers' kernels do.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from . import arg_checks
from ._base import ALL_DTYPES as FLOAT_DTYPES

OP = "merge_states"

#: MERGE-3: convention -> the values the spec defines (an array backend accepts every one)
MERGE_CONVENTIONS: Mapping[str, tuple[str, ...]] = {
    "lse_base": ("e", "2"),
    "empty_lse": ("-inf", "+inf"),
    "lse_layout": ("batch", "tokens"),
}


def merge_states(ops, outputs, lses, *, sinks=None, lse_base: str = "e", empty_lse: str = "-inf",
                 lse_layout: str = "batch"):
    """outputs: n arrays (B, h, L_q, d_v); lses: n arrays (B, h, L_q), or (h, T) with
    ``lse_layout="tokens"``; sinks (h,) or None -> (output (B, h, L_q, d_v), lse in the call's
    conventions) (MERGE-1..4). Invalid input: ValueError naming the argument (MERGE-6)."""
    conventions = {"lse_base": lse_base, "empty_lse": empty_lse, "lse_layout": lse_layout}
    outputs, lses = check_call(ops, outputs, lses, sinks, conventions)
    like = outputs[0]
    b, h, l_q, d_v = ops.shape(like)
    narrow = ops.dtype_name(like) in ("float16", "bfloat16")
    wide = (lambda x: ops.to_float32(x)) if narrow else (lambda x: x)
    outs = [wide(o) for o in outputs]
    nat = [_to_natural(ops, wide(x), b, l_q, conventions) for x in lses]
    if sinks is not None:  # MERGE-4: the sink's term, once, after the states
        zeros = ops.full((b, h, l_q), 0.0, outs[0])
        nat.append(zeros + ops.reshape(wide(ops.cast_like(sinks, like)), (1, h, 1)))
        outs.append(ops.full((b, h, l_q, d_v), 0.0, outs[0]))
    out, lse = _merge(ops, outs, nat, (b, h, l_q, d_v))
    lse = _from_natural(ops, lse, b, h, l_q, conventions)
    if narrow:
        out, lse = ops.cast_like(out, like), ops.cast_like(lse, like)
    return out, lse


def _merge(ops, outs: list, nat: list, shape: tuple[int, int, int, int]):
    """The union of states with natural lses (B, h, L_q), -inf on empty rows: (out, lse)."""
    b, h, l_q, d_v = shape
    n = len(nat)
    stacked = ops.stack(nat, -1)  # (B, h, L_q, n)
    top = ops.max_last(stacked)  # (B, h, L_q, 1); -inf on a row empty in every state
    seen = ops.isfinite(top)
    top = ops.where(seen, top, 0.0)
    weights = ops.exp(stacked - top)  # exp(-inf) = 0 for an empty state's row
    total = ops.sum_last(weights)  # >= 1 on a row some state sees, 0 otherwise
    safe = ops.where(seen, total, 1.0)
    coeff = weights / safe  # (B, h, L_q, n)
    out = ops.matmul(ops.stack(outs, -1), ops.reshape(coeff, (b, h, l_q, n, 1)))
    lse = ops.where(seen, top + ops.log(safe), -math.inf)
    return ops.reshape(out, (b, h, l_q, d_v)), ops.reshape(lse, (b, h, l_q))


def _to_natural(ops, lse, b: int, l_q: int, conventions: Mapping[str, str]):
    """A call's lse (MERGE-3) as LSE-1's: (B, h, L_q), natural, -inf on an empty row."""
    if conventions["lse_layout"] == "tokens":
        h = ops.shape(lse)[0]
        lse = ops.transpose(ops.reshape(lse, (h, b, l_q)), (1, 0, 2))
    if conventions["empty_lse"] == "+inf":
        lse = ops.where(lse != math.inf, lse, -math.inf)
    if conventions["lse_base"] == "2":
        lse = lse * math.log(2.0)
    return lse


def _from_natural(ops, lse, b: int, h: int, l_q: int, conventions: Mapping[str, str]):
    """LSE-1's lse (B, h, L_q) in the call's conventions (inverse of :func:`_to_natural`)."""
    if conventions["lse_base"] == "2":
        lse = lse / math.log(2.0)
    if conventions["empty_lse"] == "+inf":
        lse = ops.where(lse != -math.inf, lse, math.inf)
    if conventions["lse_layout"] == "tokens":
        lse = ops.reshape(ops.transpose(lse, (1, 0, 2)), (h, b * l_q))
    return lse


def check_call(ops, outputs, lses, sinks, conventions: Mapping[str, str]) -> tuple[list, list]:
    """MERGE-6: the call's arrays as lists, or ValueError naming the argument."""
    for name, value in conventions.items():
        if value not in MERGE_CONVENTIONS[name]:
            arg_checks.fail(OP, f"argument '{name}' must be one of {MERGE_CONVENTIONS[name]}, "
                                f"got {value!r}")
    outputs, lses = _sequence("outputs", outputs), _sequence("lses", lses)
    if len(lses) != len(outputs):
        arg_checks.fail(OP, f"argument 'lses' must hold one lse per output ({len(outputs)}), "
                            f"got {len(lses)}")
    shape, dtype = _described(ops, "outputs", outputs[0])
    if len(shape) != 4:
        arg_checks.fail(OP, f"argument 'outputs' must hold rank-4 (B, h, L_q, d_v) arrays, got "
                            f"shape {shape}")
    b, h, l_q, _ = shape
    want = (h, b * l_q) if conventions["lse_layout"] == "tokens" else (b, h, l_q)
    for name, arrays, expected in (("outputs", outputs, shape), ("lses", lses, want)):
        for m, x in enumerate(arrays):
            got, kind = _described(ops, name, x)
            if got != expected:
                arg_checks.fail(OP, f"argument '{name}' [{m}] must have shape {expected} "
                                    f"(lse_layout={conventions['lse_layout']!r} for outputs "
                                    f"{shape}), got {got}")
            if kind != dtype:
                arg_checks.fail(OP, f"argument '{name}' [{m}] must have the dtype of outputs[0] "
                                    f"({dtype}), got {kind}")
    if dtype not in FLOAT_DTYPES:
        arg_checks.fail(OP, f"argument 'outputs' must be floating point, got {dtype}")
    if sinks is not None:
        got, kind = _described(ops, "sinks", sinks)
        if got != (h,):
            arg_checks.fail(OP, f"argument 'sinks' must have shape (h,) = ({h},), got {got}")
    return outputs, lses


def _sequence(name: str, value) -> list:
    """``value`` as a non-empty list of arrays, or ValueError naming ``name``."""
    if hasattr(value, "shape") or not isinstance(value, (list, tuple)) or not value:
        arg_checks.fail(OP, f"argument '{name}' must be a non-empty list or tuple of arrays, got "
                            f"{type(value).__name__}")
    return list(value)


def _described(ops, name: str, x) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of an array argument, or ValueError naming it."""
    arg_checks.require_array(OP, name, x)
    return tuple(ops.shape(x)), ops.dtype_name(x)


def conventions_of(backend) -> dict[str, tuple[str, ...]]:
    """A backend's declared ``merge_conventions`` (MERGE-3), LSE-1's alone when it declares none."""
    declared: Any = getattr(backend, "merge_conventions", None)
    if declared is None:
        return {name: values[:1] for name, values in MERGE_CONVENTIONS.items()}
    return {name: tuple(declared.get(name, values[:1])) for name, values in MERGE_CONVENTIONS.items()}



# -- PAGE: the paged KV cache ---------------------------------------------------------------------
# Axis legend: P pages, S page size, g key/value heads, M table entries per item, T packed query
# tokens, n_b the queries and L_b the keys of item b. The integer data (block table, lengths, query
# offsets, slots) decides every index, so it is read as NumPy once and each item's keys are
# gathered by the backend's ``_take_keys``; the item then runs the backend's own validated
# attention (CACHE's call: its queries the last n_b of its L_b tokens, bottom-right).

PAGE_OP = "paged_attention"
WRITE_OP = "write_pages"


def paged_attention(backend, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                    causal: bool = False, scale=None):
    """q (T, h, d_k), k_pages (P, S, g, d_k), v_pages (P, S, g, d_v), block_table (B, M),
    seq_lens (B,), query_start_loc (B + 1,) -> output (T, h, d_v) (PAGE-1, PAGE-2); invalid
    input: ValueError naming the argument (PAGE-4)."""
    table, lengths, starts = check_paged(backend, q, k_pages, v_pages, block_table, seq_lens,
                                         query_start_loc, causal)
    t, h, _ = backend.ops.shape(q)
    num_pages, size, g, _ = backend.ops.shape(k_pages)
    flat_k = _flat(backend, k_pages)  # (1, g, P * S, d_k)
    flat_v = _flat(backend, v_pages)
    parts = []
    for b in range(len(lengths)):
        n = int(starts[b + 1] - starts[b])
        if n == 0:
            continue
        j = np.arange(int(lengths[b]))
        index = backend.ops.constant((table[b, j // size] * size + j % size)[None], flat_k)
        k = backend.ops.take_keys(flat_k, index)  # (1, g, L_b, d_k)
        v = backend.ops.take_keys(flat_v, index)
        rows = q[int(starts[b]):int(starts[b + 1])]
        qb = backend.ops.reshape(backend.ops.transpose(rows, (1, 0, 2)), (1, h, n, -1))
        out, _ = backend.scaled_dot_product_attention(
            qb, k, v, causal="bottom_right" if causal else None, scale=scale)
        parts.append(backend.ops.transpose(backend.ops.reshape(out, backend.ops.shape(out)[1:]),
                                        (1, 0, 2)))
    return backend.ops.concat(parts, 0) if parts else backend.ops.full(
        (0, h, backend.ops.shape(v_pages)[3]), 0.0, q)


def write_pages(backend, k_pages, v_pages, k, v, slot_mapping):
    """New (k_pages, v_pages) (P, S, g, d) with token n's key and value (k, v: (N, g, d)) in slot
    ``slot_mapping[n]`` (page slot // S, position slot % S), every other slot unchanged (PAGE-3);
    the inputs are not modified (INPUT-1). Invalid input: ValueError naming the argument."""
    slots = check_write(backend, k_pages, v_pages, k, v, slot_mapping)
    num_pages, size, g, _ = backend.ops.shape(k_pages)
    source = np.arange(num_pages * size)
    source[slots] = num_pages * size + np.arange(len(slots))  # a written slot reads its token
    written = []
    for pages, new in ((k_pages, k), (v_pages, v)):
        d = backend.ops.shape(pages)[3]
        both = backend.ops.concat([_flat(backend, pages), backend.ops.reshape(
            backend.ops.transpose(new, (1, 0, 2)), (1, g, len(slots), d))], 2)
        taken = backend.ops.take_keys(both, backend.ops.constant(source[None], both))
        written.append(backend.ops.reshape(backend.ops.transpose(
            backend.ops.reshape(taken, (g, num_pages, size, d)), (1, 2, 0, 3)),
            (num_pages, size, g, d)))
    return written[0], written[1]


def page_size_unit_of(backend) -> int:
    """The page sizes a backend takes are the multiples of its declared ``page_size_unit``
    (PAGE-1; 1, every size, when it declares none)."""
    unit = getattr(backend, "page_size_unit", 1)
    if not isinstance(unit, int) or isinstance(unit, bool) or unit < 1:
        raise ValueError(f"{getattr(backend, 'name', backend)}: page_size_unit must be a positive "
                         f"int, got {unit!r}")
    return unit


def _flat(backend, pages):
    """(P, S, g, d) -> (1, g, P * S, d): slot p * S + s on the key axis."""
    num_pages, size, g, d = backend.ops.shape(pages)
    return backend.ops.reshape(backend.ops.transpose(backend.ops.reshape(pages, (num_pages * size, g, d)),
                                               (1, 0, 2)), (1, g, num_pages * size, d))


def _ints(backend, op: str, name: str, x, shape: tuple | None = None) -> np.ndarray:
    """An integer array argument as NumPy, or ValueError naming it."""
    arg_checks.require_array(op, name, x)
    kind = backend.ops.dtype_name(x)
    if not kind.startswith(("int", "uint")):
        arg_checks.fail(op, f"argument '{name}' must be an integer array, got {kind}")
    got = np.asarray(backend.to_numpy(x)).astype(np.int64)
    if shape is not None and got.shape != shape:
        arg_checks.fail(op, f"argument '{name}' must have shape {shape}, got {got.shape}")
    return got


def _pages(backend, op: str, k_pages, v_pages) -> tuple[int, int, int, str]:
    """(P, S, g, dtype) of valid key and value pages, or ValueError naming the argument."""
    shapes = {}
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        arg_checks.require_array(op, name, x)
        shapes[name] = tuple(backend.ops.shape(x))
        if len(shapes[name]) != 4:
            arg_checks.fail(op, f"argument '{name}' must have rank 4 (P, S, g, d), got shape "
                                f"{shapes[name]}")
    (p, s, g, _), (pv, sv, gv, _) = shapes["k_pages"], shapes["v_pages"]
    if sv != s:
        arg_checks.fail(op, f"argument 'v_pages' must have the page size of k_pages ({s}), got "
                            f"{sv} (page size mismatch)")
    if (pv, gv) != (p, g):
        arg_checks.fail(op, f"argument 'v_pages' must have k_pages' pages and heads {(p, g)}, got "
                            f"{(pv, gv)}")
    dtype = backend.ops.dtype_name(k_pages)
    if dtype not in FLOAT_DTYPES or backend.ops.dtype_name(v_pages) != dtype:
        arg_checks.fail(op, f"argument 'v_pages' must have k_pages' floating dtype ({dtype}), got "
                            f"{backend.ops.dtype_name(v_pages)}")
    return p, s, g, dtype


def check_paged(backend, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, causal):
    """PAGE-4: (table, lengths, starts) as NumPy of a valid call, or ValueError naming the
    argument."""
    op = PAGE_OP
    p, s, g, dtype = _pages(backend, op, k_pages, v_pages)
    arg_checks.require_array(op, "q", q)
    shape = tuple(backend.ops.shape(q))
    if len(shape) != 3 or shape[2] != backend.ops.shape(k_pages)[3] or shape[1] % g:
        arg_checks.fail(op, f"argument 'q' must be (T, h, d_k) with d_k = "
                            f"{backend.ops.shape(k_pages)[3]} and h a multiple of g = {g}, got "
                            f"shape {shape}")
    if backend.ops.dtype_name(q) != dtype:
        arg_checks.fail(op, f"argument 'q' must have the pages' dtype ({dtype}), got "
                            f"{backend.ops.dtype_name(q)}")
    table = _ints(backend, op, "block_table", block_table)
    if table.ndim != 2:
        arg_checks.fail(op, f"argument 'block_table' must be (B, M), got shape {table.shape}")
    if table.size and (table.min() < 0 or table.max() >= p):
        arg_checks.fail(op, f"argument 'block_table' holds a page outside [0, {p}): "
                           f"{int(table.min())}..{int(table.max())}")
    batch, entries = table.shape
    lengths = _ints(backend, op, "seq_lens", seq_lens, (batch,))
    if lengths.size and (lengths.min() < 0 or lengths.max() > entries * s):
        arg_checks.fail(op, f"argument 'seq_lens' must lie in [0, M * S] = [0, {entries * s}] "
                            f"(the table's pages), got {lengths.tolist()}")
    starts = _ints(backend, op, "query_start_loc", query_start_loc, (batch + 1,))
    counts = np.diff(starts)
    if starts[0] != 0 or starts[-1] != shape[0] or np.any(counts < 0) or np.any(counts > lengths):
        arg_checks.fail(op, f"argument 'query_start_loc' must rise from 0 to T = {shape[0]} with "
                            f"at most seq_lens[b] queries per item, got {starts.tolist()}")
    if not isinstance(causal, bool):
        arg_checks.fail(op, f"argument 'causal' must be True or False, got {causal!r}")
    return table, lengths, starts


def check_write(backend, k_pages, v_pages, k, v, slot_mapping) -> np.ndarray:
    """PAGE-4 for :func:`write_pages`: the slots as NumPy, or ValueError naming the argument."""
    op = WRITE_OP
    p, s, g, dtype = _pages(backend, op, k_pages, v_pages)
    for name, x, pages in (("k", k, k_pages), ("v", v, v_pages)):
        arg_checks.require_array(op, name, x)
        want = (g, backend.ops.shape(pages)[3])
        got = tuple(backend.ops.shape(x))
        if len(got) != 3 or got[1:] != want or backend.ops.dtype_name(x) != dtype:
            arg_checks.fail(op, f"argument '{name}' must be (N, g, d) = (N, {want[0]}, {want[1]}) "
                                f"of dtype {dtype}, got shape {got}, {backend.ops.dtype_name(x)}")
    n = backend.ops.shape(k)[0]
    if backend.ops.shape(v)[0] != n:
        arg_checks.fail(op, f"argument 'v' must hold k's {n} tokens, got {backend.ops.shape(v)[0]}")
    slots = _ints(backend, op, "slot_mapping", slot_mapping, (n,))
    if slots.size and (slots.min() < 0 or slots.max() >= p * s or len(set(slots.tolist())) < n):
        arg_checks.fail(op, f"argument 'slot_mapping' must hold distinct slots in [0, P * S) = "
                           f"[0, {p * s}), got {slots.tolist()}")
    return slots


__all__ = ["MERGE_CONVENTIONS", "check_call", "check_paged", "check_write", "conventions_of",
           "merge_states", "page_size_unit_of", "paged_attention", "write_pages"]
