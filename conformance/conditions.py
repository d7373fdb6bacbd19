"""Condition spaces: for a clause, the dimensions along which its condition arises and the values
each takes; the cases every profile draws from them; and what a run recorded as having run.

Axis legend: B batch, h heads, L_q queries, L_k keys (L_K with a cache), d_k / d_v widths.

A clause's :class:`Space` names dimensions of :data:`DIMENSIONS` (``op``, ``lengths``,
``empty_by``, ``bias``, ...). Every profile, ``ci`` included, runs every value of every dimension
and every pair of values of two dimensions (the clause's text combines each of them) in every
backend x device x dtype cell: ``op`` is the test's parameter, and :func:`cover` adds the rows of
a pairwise covering array over the other dimensions (:func:`covering_rows`) as explicit examples,
which Hypothesis runs in every phase setting; :func:`specs` then draws rows of the space with the
rest (seed, scale of the logits, projection biases, sizes off the ci menu) varied.

The cases are built so the condition holds as named (:func:`row_spec`): a row emptied by key
padding has a batch item whose keys are all padded, and so on. Nothing rewrites them into other
cases: what a backend cannot take (a capability it does not claim) is dropped by
``harness.fit`` and recorded as what actually ran, and :func:`uncovered` reports the combinations
that needed it as not implemented. What ran is read back from the cases themselves
(:func:`observe`), not from what was asked for: the harness notes every case it runs on the test
item (:func:`note`) and the plugin writes :func:`ran` into each result.

Why the spaces are what they are (the audit of the masking chapter; other clauses declare none
yet and are listed as such by ``mhaspec conditions``):

* MASK-6 / MASK-7: the alignments differ only when L_q != L_k, most at L_q = 1 < L_k (decoding),
  and bottom-right empties rows when L_q > L_k: every ordering with every operation.
* WIN-1 / ALIBI-1: the diagonal's alignment decides which keys a window admits and each
  distance, and differs when L_q != L_k (most at decoding): every alignment with every ordering
  and operation.
* CACHE-2: with a cache the diagonal sits at the past length, per batch item when the cache is
  partly valid; decoding (one new query after the cache) is the commonest call of all: every
  ordering of L_q and L_K with a full and a partly valid cache, in each operation.
* MASK-8: every combination of the boolean masks and the bias: a mask and key padding with
  causal in either alignment, with and without a bias, in every ordering and operation.
* MASK-9: a row's allowed set empties by a boolean mask, bottom-right causal (L_q > L_k), key
  padding (a batch item padded throughout), a window (L_q > L_k), segment ids, sequence lengths,
  or a -inf bias; each with and without a finite bias (libraries that merge the masks into the
  bias with a finite fill give the mean of V only when a bias is present), in each operation and
  ordering of the lengths that lets it empty a row. Top-left causal never empties a row (key 0
  stays allowed); L_k = 0 empties every row and is SHAPE-4's own test.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Mapping, NamedTuple

import numpy as np
import pytest
from hypothesis import example, reject, strategies as st

from mhaspec.spec import oracle

from . import extremes, features
from .strategies import CI_SHAPES, LENGTHS, CaseSpec, build_case, shape_menu

#: L_q vs L_k: decoding (L_q = 1 < L_k), L_q < L_k (L_q > 1), prefill (L_q = L_k), L_q > L_k
LENGTH_ORDERS = ("decode", "L_q<L_k", "L_q=L_k", "L_q>L_k")
#: the ways a query row's allowed set becomes empty (MASK-9)
EMPTY_BY = ("mask", "causal_bottom_right", "key_padding", "window", "segments", "seq_lengths",
            "minus_inf_bias")

#: dimension -> its values
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "op": ("sdpa", "mha"),
    "lengths": LENGTH_ORDERS,
    "empty_by": EMPTY_BY,
    "bias": ("none", "finite"),
    "alignment": ("top_left", "bottom_right"),
    "past": ("all_valid", "per_item_lengths"),
    "causal": ("top_left", "bottom_right"),
}

#: (dimension, value) -> the capability a case with it needs (others: the clause's own)
NEEDS = {("op", "sdpa"): "sdpa", ("op", "mha"): "mha",
         ("empty_by", "mask"): "masks", ("empty_by", "key_padding"): "masks",
         ("empty_by", "causal_bottom_right"): "causal", ("empty_by", "window"): "window",
         ("empty_by", "segments"): "segments", ("empty_by", "seq_lengths"): "segments",
         ("empty_by", "minus_inf_bias"): "bias", ("bias", "finite"): "bias"}


def _empties_a_row(row: Mapping[str, str]) -> bool:
    """A causal mask or a window alone empties rows only when L_q > L_k; a -inf bias is a bias."""
    if row.get("empty_by") in ("causal_bottom_right", "window") and row.get("lengths") != "L_q>L_k":
        return False
    return not (row.get("empty_by") == "minus_inf_bias" and row.get("bias") == "none")


def _always(row: Mapping[str, str]) -> bool:
    return True


class Space(NamedTuple):
    """A clause's condition space: its dimensions (``op`` first when the test is parametrized by
    operation), the fixed fields its cases carry (e.g. the causal alignment of MASK-6), and which
    full rows are possible."""

    dimensions: tuple[str, ...]
    fixed: Mapping[str, object] = {}
    possible: Callable[[Mapping[str, str]], bool] = _always


SPACES: dict[str, Space] = {
    "MASK-6": Space(("op", "lengths"), {"causal": "top_left"}),
    "MASK-7": Space(("op", "lengths"), {"causal": "bottom_right"}),
    "MASK-8": Space(("op", "lengths", "causal", "bias"), {"key_padding": True}),
    "MASK-9": Space(("op", "empty_by", "bias", "lengths"), {}, _empties_a_row),
    "WIN-1": Space(("op", "lengths", "alignment"), {"window": (1, 0)}),
    "ALIBI-1": Space(("op", "lengths", "alignment"), {"alibi": "geometric"}),
    "CACHE-2": Space(("op", "lengths", "past"), {"past_len": 3, "causal": "bottom_right"}),
}

# -- spec 1.3 (training and sinks): the condition spaces of GRAD-7 and SINK-2 -----------------
# GRAD-7: the exact zeros arise where a query row or a key loses every partner, in each of the
# ways MASK-9 names (the zeros of dk/dv follow from the same emptied rows and columns), with and
# without a finite bias, in each ordering of the lengths that lets it happen. SINK-2: a sink makes
# those same rows non-empty in the denominator (lse = the sink), so its space is MASK-9's too.
# Both tests run scaled dot-product attention only (the operation has no ``op`` parameter).
SPACES.update({
    "GRAD-7": Space(("empty_by", "bias", "lengths"), {}, _empties_a_row),
    "SINK-2": Space(("empty_by", "lengths"), {}, _empties_a_row),
})
# -- end of spec 1.3's spaces ----------------------------------------------------------------


def _rows(space: Space, dims: tuple[str, ...]) -> list[dict[str, str]]:
    """Every possible full row over ``dims`` (product of values, filtered)."""
    rows = [dict(zip(dims, values)) for values in itertools.product(*(DIMENSIONS[d] for d in dims))]
    return [r for r in rows if space.possible(r)]


def pairs(row: Mapping[str, str]) -> set[tuple]:
    """The single values and the pairs of values one row covers, as sorted item tuples."""
    items = sorted(row.items())
    return {(i,) for i in items} | set(itertools.combinations(items, 2))


@functools.lru_cache(maxsize=None)
def covering_rows(clause: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A pairwise covering array over the clause's dimensions other than ``op``: rows (as item
    tuples) that together hold every value and every possible pair of values. Greedy and
    deterministic: each next row is the possible row covering most pairs still missing (first in
    product order on ties)."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    candidates = _rows(space, dims)
    missing = set().union(*(pairs(r) for r in candidates))
    chosen = []
    while missing:
        best = max(candidates, key=lambda r: len(pairs(r) & missing))
        chosen.append(tuple(best.items()))
        missing -= pairs(best)
    return tuple(chosen)


# -- building the case of a row --------------------------------------------------------------------

def order_of(len_q: int, len_k: int) -> str:
    """The value of ``lengths`` for these lengths."""
    if len_q == 1 and len_k > 1:
        return "decode"
    return "L_q<L_k" if len_q < len_k else "L_q=L_k" if len_q == len_k else "L_q>L_k"


def _shape_for(order: str, draw=None, past: int = 0):
    """Sizes for ``order`` of L_q vs L_K = ``past`` + L_k: the first ci shape of that order
    (drawn from them and, off the menu, from the free sizes when ``draw`` is given)."""
    menu = [s for s in CI_SHAPES if order_of(s.len_q, s.len_k + past) == order and
            s.len_k + past > 1]
    if draw is None:
        return menu[0]
    if shape_menu.get() is not None:
        return draw(st.sampled_from(menu))
    lq, lk = draw(st.sampled_from([(a, b) for a in LENGTHS for b in LENGTHS
                                   if b + past > 1 and order_of(a, b + past) == order]))
    return draw(st.sampled_from(menu))._replace(len_q=lq, len_k=lk)


def _fields(row: Mapping[str, str], shape) -> dict:
    """The CaseSpec fields that make ``row`` hold on ``shape`` (before a seed is chosen)."""
    b, h, lq, lk = shape.batch, shape.heads, shape.len_q, shape.len_k
    full = (b, h, lq, lk)
    kw: dict = {}
    if row.get("bias") == "finite" or row.get("empty_by") == "minus_inf_bias":
        kw["bias_shape"] = full
    if "alignment" in row:
        kw["alignment"] = row["alignment"]
    if "causal" in row:  # with a boolean mask and key padding (MASK-8's combination)
        kw.update(causal=row["causal"], mask_shape=full)
    if "past" in row:
        kw["past_valid"] = row["past"] == "per_item_lengths"
    way = row.get("empty_by")
    if way == "mask":
        kw.update(mask_shape=full, fully_masked_rows=True)
    elif way == "causal_bottom_right":
        kw["causal"] = "bottom_right"
    elif way == "key_padding":
        kw.update(key_padding=True, fully_masked_rows=True)
    elif way == "window":
        kw.update(window=(0, 0), alignment="top_left")
    elif way == "segments":
        kw["segments"] = "per_token" if lq > lk else "scattered"
    elif way == "seq_lengths":
        kw["seq_lengths"] = "both"
    elif way == "minus_inf_bias":
        kw["extreme"] = extremes.BLOCKED_BIAS_ROWS
    return kw


#: seeds tried, from the drawn one on, for a case whose condition depends on random arrays
SEED_TRIES = 64


def row_spec(clause: str, row: Mapping[str, str], *, shape=None, seed: int = 0,
             **rest) -> CaseSpec:
    """The case of ``row`` of ``clause``'s space: the clause's fixed fields, the fields the row's
    values need, ``shape`` (default: the ci shape of its ``lengths``), ``rest`` (other CaseSpec
    fields), and the first seed from ``seed`` on for which :func:`observe` finds the row (cases
    whose condition depends on random arrays, e.g. segment ids that leave a query alone).
    Raises ValueError when none of :data:`SEED_TRIES` seeds does (a declaration no case meets)."""
    space = SPACES[clause]
    shape = shape or _shape_for(row.get("lengths", "L_q=L_k"), past=space.fixed.get("past_len", 0))
    base = CaseSpec(**shape._asdict(), self_attention=False, **{**space.fixed, **rest},
                    **_fields(row, shape))
    want = {k: v for k, v in row.items() if k != "op"}
    for s in range(seed, seed + SEED_TRIES):
        spec = base._replace(seed=s)
        if any(_matches(seen, want) for seen in observe(spec, "sdpa", space.dimensions)):
            return spec
    raise ValueError(f"{clause}: no case of row {want} on {shape} within {SEED_TRIES} seeds")


def _matches(seen: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(seen.get(k) == v for k, v in want.items())


def cover(clause: str):
    """Decorator: the rows of :func:`covering_rows` as explicit examples ``spec=...`` of a
    ``@given`` test (put it above ``@given``)."""
    def decorate(test):
        for i, row in enumerate(covering_rows(clause)):
            test = example(spec=row_spec(clause, dict(row), seed=1000 * i))(test)
        return test
    return decorate


@st.composite
def specs(draw, clause: str) -> CaseSpec:
    """A case of a possible row of ``clause``'s space, drawn with the rest varied: the seed, the
    scale of the logits, projection biases, and (off the ci menu) the sizes."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    row = draw(st.sampled_from(_rows(space, dims)))
    shape = _shape_for(row.get("lengths", "L_q=L_k"), draw, space.fixed.get("past_len", 0))
    try:
        return row_spec(clause, row, shape=shape, seed=draw(st.integers(0, 2**16)),
                        use_bias=draw(st.booleans()),
                        logit_scale=draw(st.sampled_from((1.0, 10.0))))
    except ValueError:  # no seed makes these sizes hold the row: another draw (the explicit
        reject()  # rows of cover() hold every row)


# -- what ran -------------------------------------------------------------------------------------

def _emptied(case, **kw) -> bool:
    """Whether the sdpa oracle on ``case`` with only the keyword arguments ``kw`` has a row of
    all-zero weights (an empty allowed set)."""
    try:
        res = oracle.attention_result(case.q, case.k, case.v, **kw)
    except ValueError:
        return False
    return bool((~np.any(res.weights != 0, axis=-1)).any())


@functools.lru_cache(maxsize=8192)
def _ways_emptied(spec: CaseSpec) -> tuple[str, ...]:
    """The ways of :data:`EMPTY_BY` that alone leave a row of ``spec`` without allowed keys
    (cases with a cache: not classified, empty)."""
    if spec.past_len is not None or min(spec.batch, spec.len_q, spec.len_k) == 0:
        return ()
    case = build_case(spec)
    f, full = case.features, (spec.batch, spec.heads, spec.len_q, spec.len_k)
    ways = {
        "mask": case.mask is not None
        and bool((~np.broadcast_to(case.mask, full).any(axis=-1)).any()),
        "causal_bottom_right": spec.causal == "bottom_right" and spec.len_q > spec.len_k,
        "key_padding": case.key_padding_mask is not None
        and bool((~case.key_padding_mask.any(axis=-1)).any()),
        "window": spec.window is not None and _emptied(
            case, window=spec.window, alignment=spec.alignment or spec.causal or "bottom_right"),
        "segments": spec.segments is not None and _emptied(
            case, q_segment_ids=f.q_segment_ids, kv_segment_ids=f.kv_segment_ids),
        "seq_lengths": spec.seq_lengths is not None and _emptied(
            case, query_seq_lengths=f.query_seq_lengths,
            key_value_seq_lengths=f.key_value_seq_lengths),
        "minus_inf_bias": case.bias is not None and bool(
            np.all(np.broadcast_to(case.bias, full) == -np.inf, axis=-1).any()),
    }
    return tuple(w for w in EMPTY_BY if ways[w])


def observe(spec: CaseSpec, op: str, dimensions: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows over ``dimensions`` that the case ``spec`` (as run: fitted to the backend) holds:
    one per way its rows empty (``empty_by`` "none" when none does)."""
    base = {"op": op, "lengths": order_of(spec.len_q, features.key_length(spec)),
            "bias": "none" if spec.bias_shape is None else "finite",
            "alignment": spec.alignment or spec.causal
            or ("bottom_right" if spec.past_len is not None else "none"),
            "causal": spec.causal or "none",
            "past": "none" if spec.past_len is None
            else "per_item_lengths" if spec.past_valid else "all_valid"}
    ways = _ways_emptied(spec) if "empty_by" in dimensions else ("none",)
    return [{d: {**base, "empty_by": w}[d] for d in dimensions} for w in ways or ("none",)]


#: the cases the running test ran: a set of (op, CaseSpec) on ``item.stash``
RAN_KEY = pytest.StashKey[set]()


def note(item, op: str, spec: CaseSpec) -> None:
    """Keep that ``item`` ran ``op`` on the (fitted) case ``spec``."""
    item.stash.setdefault(RAN_KEY, set()).add((op, spec))


#: what every clause without a declared space records of its cases (the audit shows it)
GENERIC = ("op", "lengths")


def dimensions_of(clause: str) -> tuple[str, ...]:
    """The clause's declared dimensions, else :data:`GENERIC` (observed, not required)."""
    return SPACES[clause].dimensions if clause in SPACES else GENERIC


def ran(item, clauses) -> dict[str, list[dict[str, str]]]:
    """clause -> the distinct rows over :func:`dimensions_of` the cases ``item`` ran hold."""
    cases = item.stash.get(RAN_KEY, set())
    out = {}
    for clause in clauses if cases else ():
        dims = dimensions_of(clause)
        rows = {tuple(r.items()) for op, spec in cases for r in observe(spec, op, dims)}
        out[clause] = [dict(r) for r in sorted(rows)]
    return out


def required(clause: str, capabilities) -> set[tuple]:
    """The single values and pairs a cell must run for ``clause``: those of possible rows whose
    values need only ``capabilities`` (the operations among them)."""
    space = SPACES[clause]
    rows = [r for r in _rows(space, space.dimensions)
            if all(NEEDS.get(item, None) in (None, *capabilities) for item in r.items())]
    return set().union(set(), *(pairs(r) for r in rows))


def uncovered(clause: str, rows_ran, capabilities) -> list[str]:
    """What of :func:`required` the rows that ran (dicts over the clause's dimensions) miss, each
    as ``"dim=value"`` or ``"dim=value & dim=value"``; [] when covered."""
    seen = set().union(set(), *(pairs(r) for r in rows_ran))
    return sorted(" & ".join(f"{d}={v}" for d, v in p)
                  for p in required(clause, capabilities) - seen)


def not_implemented(clause: str, capabilities) -> list[str]:
    """The values of ``clause``'s space a backend with ``capabilities`` cannot run (reported as
    not implemented sub-cases): ``"dim=value (needs capability)"``."""
    return [f"{d}={v} (needs {NEEDS[(d, v)]})" for d in SPACES[clause].dimensions
            for v in DIMENSIONS[d] if NEEDS.get((d, v), None) not in (None, *capabilities)]


def unclaimed(clauses, capabilities) -> dict[str, list[str]]:
    """clause -> :func:`not_implemented` for the ``clauses`` with a declared space (only those
    with some)."""
    out = {c: not_implemented(c, capabilities) for c in clauses if c in SPACES}
    return {c: values for c, values in out.items() if values}


#: outcomes of results whose test ran its cases (a declared deviation ran them too)
RAN_OUTCOMES = ("pass", "fail", "deviation", "stale-deviation")


def run_gaps(results, capabilities: Mapping[str, frozenset]) -> dict[tuple, list[str]]:
    """(backend, device, dtype, clause) -> :func:`uncovered` for every cell of a run's
    ``results`` that ran a test of a clause with a declared space; ``capabilities``: backend
    name -> what it claims. Cells with nothing missing are left out ({}: every space covered)."""
    seen: dict[tuple, list] = {}
    for r in results:
        if r["outcome"] not in RAN_OUTCOMES:
            continue
        for clause in r["clauses"]:
            if clause in SPACES:
                key = (r["backend"], r["device"], r["dtype"], clause)
                seen.setdefault(key, []).extend(r.get("conditions", {}).get(clause, []))
    gaps = {key: uncovered(key[3], rows, capabilities[key[0]]) for key, rows in seen.items()}
    return {key: missing for key, missing in gaps.items() if missing}


def audit_table(results, clause_ids, capabilities: Mapping[str, frozenset]) -> str:
    """Markdown: per clause, its dimensions, the values each took in the run's ``results`` (in
    every cell: a value some cell missed is marked ``(not every cell)``), and, for a declared
    space, the covering rows and what a cell missed (:func:`run_gaps`)."""
    by_clause: dict[str, dict[tuple, list]] = {}
    for r in results:
        if r["outcome"] in RAN_OUTCOMES:
            for clause in r["clauses"]:
                cell = (r["backend"], r["device"], r["dtype"])
                by_clause.setdefault(clause, {}).setdefault(cell, []).extend(
                    r.get("conditions", {}).get(clause, []))
    gaps = run_gaps(results, capabilities)
    lines = ["| clause | dimensions | declared | values run (every cell) | covering rows "
             "| missed |",
             "|---|---|---|---|---|---|"]
    for clause in clause_ids:
        cells = by_clause.get(clause, {})
        dims = dimensions_of(clause)
        shown = []
        for d in dims:
            per_cell = [{row.get(d) for row in rows} for rows in cells.values()] or [set()]
            every, some = set.intersection(*per_cell), set.union(*per_cell)
            values = [v for v in dict.fromkeys((*DIMENSIONS[d], "none")) if v in some]
            shown.append(f"{d}: " + ", ".join(v if v in every else f"{v} (not every cell)"
                                               for v in values) if values else f"{d}: -")
        missed = sorted({m for key, ms in gaps.items() if key[3] == clause for m in ms})
        if clause not in SPACES and any(cells.values()):  # observed: orderings no case had
            seen = {row.get("lengths") for rows in cells.values() for row in rows}
            missed = [f"lengths={v} (not required)" for v in LENGTH_ORDERS if v not in seen]
        lines.append(f"| {clause} | {', '.join(dims)} | {'yes' if clause in SPACES else 'no'} | "
                     f"{'; '.join(shown) if any(cells.values()) else _silent(cells)} | "
                     f"{len(covering_rows(clause)) if clause in SPACES else '-'} | "
                     f"{', '.join(missed) or '-'} |")
    return "\n".join(lines) + "\n"


def _silent(cells) -> str:
    return "ran, no case through the harness (direct calls)" if cells else "did not run"


def main(argv=None) -> int:
    """``python -m mhaspec.conformance.conditions REPORT.json``: the audit table (markdown) of
    a run's ``--mhaspec-report`` results, for registered backends."""
    import json
    import sys

    from mhaspec.backends import load_backend
    from mhaspec.spec import generated_marker, load as load_spec

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mhaspec.conformance.conditions REPORT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        results = json.load(f)
    claims = {name: frozenset(load_backend(name).capabilities)
              for name in {r["backend"] for r in results}}
    spec = load_spec()
    print(generated_marker(spec.version))
    print(audit_table(results, spec.testable_ids, claims), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
