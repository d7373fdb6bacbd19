"""The covering rows of a clause's condition space (:mod:`.conditions`) and the case of each row.

Axis legend: B batch, h heads, L_q queries, L_k keys (L_K with a cache), d_k / d_v widths.

Every profile, ``ci`` included, runs every value of every dimension and every pair of values of
two dimensions (the clause's text combines each of them) in every backend x device x dtype cell:
``op`` is the test's parameter, and :func:`cover` adds the rows of a pairwise covering array over
the other dimensions (:func:`covering_rows`) as explicit examples, which Hypothesis runs in every
phase setting (in the derandomized ``ci`` profile they count toward the test's examples,
:func:`with_budget`, so ci stays as cheap); :func:`specs` then draws rows of the space with the
rest (seed, scale of the logits, projection biases, sizes off the ci menu) varied. A test that is
no Hypothesis test (a rejection) runs :func:`row_specs`.

The cases are built so the condition holds as named (:func:`row_spec`): a row emptied by key
padding has a batch item whose keys are all padded, and so on. Nothing rewrites them into other
cases: what a backend cannot take (a capability it does not claim) is dropped by
``harness.fit`` and recorded as what actually ran (:mod:`.observation`).
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Mapping

from hypothesis import example, reject, settings, strategies as st

from . import extremes
from .conditions import (CAPS, CHUNKS, DEGENERATE, RECORDED, SLOPES, SPACES, WINDOWS, Space,
                         bias_shape_of, every_row, fixed_fields, values_of)
from .item_state import shape_menu
from .observation import observe, order_of
from .strategies import CI_SHAPES, CaseSpec, Shapes
from .strategies import LENGTHS as SIZES  # the length menu (conditions.LENGTHS: dimensions)


def possible_rows(space: Space, dims: tuple[str, ...]) -> list[dict[str, str]]:
    """Every possible full row over ``dims`` (product of values, filtered)."""
    rows = [dict(zip(dims, values))
            for values in itertools.product(*(values_of(space, d) for d in dims))]
    return [r for r in rows if space.possible(r)]


def pairs(row: Mapping[str, str], strength: int = 2) -> set[tuple]:
    """The single values and the pairs of values one row covers, as sorted item tuples (with
    ``strength`` 3 also its triples)."""
    items = sorted(row.items())
    return {c for n in range(1, strength + 1) for c in itertools.combinations(items, n)}


@functools.lru_cache(maxsize=None)
def covering_rows(clause: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A pairwise covering array over the clause's dimensions other than ``op`` (3-way where its
    space says ``strength=3``): rows (as item tuples) that together hold every value and every
    possible pair (triple) of values. Greedy and
    deterministic: each next row is the possible row covering most pairs still missing (first in
    product order on ties)."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    candidates = possible_rows(space, dims)
    ways = functools.partial(pairs, strength=space.strength)
    missing = set().union(*(ways(r) for r in candidates))
    chosen = []
    while missing:
        best = max(candidates, key=lambda r: len(ways(r) & missing))
        chosen.append(tuple(best.items()))
        missing -= ways(best)
    return tuple(chosen)


# -- building the case of a row --------------------------------------------------------------------

def _past(space: Space) -> int:
    """L_past of the space's cases (0: no cache)."""
    return 0 if callable(space.fixed) else space.fixed.get("past_len") or 0


def _shape_for(order: str, draw=None, past: int = 0):
    """Sizes for ``order`` of L_q vs L_K = ``past`` + L_k: the first ci shape of that order
    (drawn from them and, off the menu, from the free sizes when ``draw`` is given)."""
    menu = [s for s in CI_SHAPES if order_of(s.len_q, s.len_k + past) == order and
            s.len_k + past > 1]
    if draw is None:
        return menu[0]
    if shape_menu() is not None:
        return draw(st.sampled_from(menu))
    lq, lk = draw(st.sampled_from([(a, b) for a in SIZES for b in SIZES
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
    kw.update(_feature_fields(row, shape))
    return kw


def _feature_fields(row: Mapping[str, str], shape) -> dict:
    """The fields of the dimensions beyond masking (sizes, groups, soft-cap, window, ...)."""
    full = (shape.batch, shape.heads, shape.len_q, shape.len_k)
    kw: dict = {}
    zero = row.get("zero")
    if zero is not None:
        kw.update({name: 0 for name in zero.split("+")})
    if "degenerate" in row:
        kw.update(DEGENERATE[row["degenerate"]])
    if "heads" in row:
        kw["heads"] = 1 if row["heads"] == "1" else max(2, shape.heads)
    if "width" in row:
        kw["d_k"] = 1 if row["width"] == "1" else max(2, shape.d_k)
    if "head_widths" in row:
        one = row["head_widths"] != "wider"
        kw.update(d_k=1 if one else max(2, shape.d_k), d_v=1 if one else max(2, shape.d_v))
    if "projection_bias" in row:
        kw["use_bias"] = row["projection_bias"] == "with"
    group = row.get("group")
    if group == "1<g<h":
        kw.update(heads=4, kv_heads=2)
    elif group is not None:
        heads = max(2, shape.heads)
        kw.update(heads=heads, kv_heads=heads if group == "g=h" else 1)
    if row.get("empty_rows") == "some":
        kw.update(mask_shape=full, fully_masked_rows=True)
    masked = row.get("masked_by")
    if masked == "mask":
        kw["mask_shape"] = full
    elif masked == "empty_row":
        kw.update(mask_shape=full, fully_masked_rows=True)
    if "cap" in row:
        kw["softcap"] = CAPS[row["cap"]]
    if "bias_broadcast" in row:
        kw["bias_shape"] = bias_shape_of(row["bias_broadcast"], full)
    if "window" in row:
        kw.update(window=WINDOWS[row["window"]], alignment=row.get("alignment", "bottom_right"))
    if "chunk" in row:
        kw.update(chunk=CHUNKS[row["chunk"]], alignment=row.get("alignment", "bottom_right"))
    if row.get("chunk_positions") == "packed":
        kw["segments"] = "packed"
    if "slopes" in row:
        kw.update(alibi=SLOPES[row["slopes"]], alignment=row.get("alignment", "bottom_right"))
    if row.get("with_causal") == "yes":
        kw["causal"] = row.get("alignment", "bottom_right")
    if "segments" in row:
        kw["segments"] = row["segments"]
    if "seq_lengths" in row:
        kw["seq_lengths"] = row["seq_lengths"]
    if "nonfinite" in row:
        kw["extreme"] = extremes.masked_key(row["nonfinite"])
    shared = row.get("shared")
    if shared == "self":
        kw["self_attention"] = True
    elif shared is not None:
        kw["extreme"] = extremes.shared(shared)
    if "group" in row or "heads" in row:  # mask shapes over the heads drawn here
        kw.update({f: (*v[:1], kw.get("heads", shape.heads), *v[2:]) for f, v in
                   kw.items() if f in ("mask_shape", "bias_shape") and v is not None})
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
    shape = space.shape(shape or _shape_for(row.get("lengths", "L_q=L_k"), past=_past(space)))
    if row.get("head_widths") == "d_k=d_v=1,h=L":  # as many heads as the longer length has tokens
        shape = shape._replace(heads=max(2, shape.len_q, shape.len_k))
    base = CaseSpec(**{**shape._asdict(), "self_attention": False, **fixed_fields(space, shape),
                       **rest, **_fields(row, shape)})
    if base.self_attention:  # one array for query, key and value: its widths
        width = base.heads * base.d_k
        base = base._replace(d_v=base.d_k, d_model=width, k_dim=width, v_dim=width)
    want = {k: v for k, v in row.items() if k != "op" and k not in RECORDED}
    for s in range(seed, seed + SEED_TRIES):
        spec = base._replace(seed=s)
        if any(_matches(seen, want) for seen in observe(spec, "sdpa", space.dimensions)):
            return spec
    raise ValueError(f"{clause}: no case of row {want} on {shape} within {SEED_TRIES} seeds")


def _matches(seen: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(seen.get(k) == v for k, v in want.items())


def cover(clause: str, only: Callable[[Mapping[str, str]], bool] = every_row, **arguments):
    """Decorator: the rows of :func:`covering_rows` (those ``only`` keeps: a clause two tests
    share) as explicit examples ``spec=...`` of a ``@given`` test (put it above ``@given``);
    ``arguments``: the test's other arguments, as each example passes them (a row's value of a
    dimension the test takes as an argument overrides them, :attr:`Space.arguments`)."""
    space = SPACES[clause]

    def decorate(test):
        rows = [dict(row) for row in covering_rows(clause) if only(dict(row))]
        for i, row in enumerate(rows):
            extra = dict(arguments)
            for d, to_args in space.arguments.items():
                extra.update(to_args(row[d]))
            test = example(spec=row_spec(clause, row, seed=1000 * i), **extra)(test)
        return with_budget(test, len(rows))
    return decorate


#: the fewest cases Hypothesis draws beside a test's covering rows in a derandomized profile
MIN_DRAWN = 2


def with_budget(test, rows: int):
    """``test`` with its covering ``rows`` counted toward the examples of a derandomized profile
    (``ci``, ``triage``: the covering rows choose cases there): Hypothesis draws the profile's
    ``max_examples`` minus the rows, at least :data:`MIN_DRAWN`. Random profiles (``certify``,
    ``dev``) draw their full number beside the rows. The profile is the one loaded when the test
    module is imported (the plugin loads it before collection)."""
    profile = settings.default
    if not profile.derandomize or not rows:
        return test
    return settings(profile, max_examples=max(MIN_DRAWN, profile.max_examples - rows))(test)


def row_specs(clause: str, spec: CaseSpec, keep: tuple[str, ...] = ()) -> list[CaseSpec]:
    """``spec`` on the sizes of each covering row of ``clause`` but those named in ``keep`` (a
    test that is no Hypothesis test, e.g. a rejection, runs each in every operation it runs)."""
    rows = [row_spec(clause, dict(row)) for row in covering_rows(clause)]
    return [spec._replace(**{f: getattr(r, f) for f in Shapes._fields if f not in keep},
                          self_attention=False) for r in rows]


@st.composite
def specs(draw, clause: str) -> CaseSpec:
    """A case of a possible row of ``clause``'s space, drawn with the rest varied: the seed, the
    scale of the logits, projection biases, and (off the ci menu) the sizes."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    row = draw(st.sampled_from(possible_rows(space, dims)))
    shape = _shape_for(row.get("lengths", "L_q=L_k"), draw, _past(space))
    try:
        return row_spec(clause, row, shape=shape, seed=draw(st.integers(0, 2**16)),
                        use_bias=draw(st.booleans()),
                        logit_scale=draw(st.sampled_from((1.0, 10.0))))
    except ValueError:  # no seed makes these sizes hold the row: another draw (the explicit
        reject()  # rows of cover() hold every row)

