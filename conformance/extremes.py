"""Extreme inputs for a :class:`~mhaspec.conformance.strategies.CaseSpec`: subnormals (NUM-5), NaN
and infinities (NUM-6) and non-finite keys behind masks (MASK-13).

A case names its extreme in ``CaseSpec.extreme``, a short string, and :func:`apply` writes it into
the arrays :func:`~mhaspec.conformance.strategies.build_case` drew; so the printed ``CaseSpec``
still reproduces the case exactly, extremes included.

* ``"subnormal:<dtype>:query"``: ``q`` and ``query`` scaled into the dtype's subnormal range (about
  95% of their entries are then subnormal in ``<dtype>``); ``"subnormal:<dtype>:value"``: ``v``
  and ``value`` likewise. In self-attention ``query``, ``key`` and ``value`` are one array.
* ``"nonfinite:<value>:<array>"``: one entry of ``<array>`` (``q``, ``k``, ``v``, ``query``,
  ``key``, ``value`` or a parameter ``w_q`` ... ``b_o``) set to ``<value>`` (``nan``, ``inf`` or
  ``-inf``); the entry is drawn from the case's seed.
* ``"masked-key:<value>"``: per batch item, component 0 of the key most often excluded by the
  boolean masks (in every head of ``k``, and in ``key``) set to ``<value>``.
* ``"blocked-bias-rows"``: some query rows of ``bias`` (drawn from the case's seed, at least one)
  set to -inf in every key: rows emptied by the bias alone (MASK-2, MASK-9).
* ``"shared:key=value"`` / ``"shared:query=key"``: two of the multi-head inputs are one array (the
  shapes must allow it): the encoder memory used as key and value, or query and key shared with a
  separate value. Backends that pick a fused projection by array identity must get these right.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.spec import oracle

from .tolerance import SMALLEST_NORMAL

NONFINITE = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}

#: The tests that feed NaN and infinities (NUM-6, MASK-13) make NumPy warn of invalid values and
#: overflow by design, in the oracle and in the backend; this mark keeps those warnings (and no
#: others) out of the run's summary.
EXPECTED_NONFINITE_WARNINGS = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning")
ARRAYS = ("q", "k", "v", "query", "key", "value")
PARAMS = oracle.Params._fields


def subnormal(dtype: str, which: str) -> str:
    if dtype not in SMALLEST_NORMAL or which not in ("query", "value"):
        raise ValueError(f"subnormal: unknown dtype {dtype!r} or input {which!r}")
    return f"subnormal:{dtype}:{which}"


def nonfinite(value: str, array: str) -> str:
    if value not in NONFINITE or array not in ARRAYS + PARAMS:
        raise ValueError(f"nonfinite: unknown value {value!r} or array {array!r}")
    return f"nonfinite:{value}:{array}"


def masked_key(value: str) -> str:
    if value not in NONFINITE:
        raise ValueError(f"masked_key: unknown value {value!r}")
    return f"masked-key:{value}"


SHARED = ("key=value", "query=key")


def shared(which: str) -> str:
    if which not in SHARED:
        raise ValueError(f"shared: unknown pairing {which!r}")
    return f"shared:{which}"


BLOCKED_BIAS_ROWS = "blocked-bias-rows"


def blocked_bias_rows(rest: str = "") -> str:
    if rest:
        raise ValueError(f"{BLOCKED_BIAS_ROWS} takes no arguments, got {rest!r}")
    return BLOCKED_BIAS_ROWS


#: kind -> the builder that checks its arguments and writes the extreme back
_BUILDERS = {"subnormal": subnormal, "nonfinite": nonfinite, "masked-key": masked_key,
             "shared": shared, BLOCKED_BIAS_ROWS: blocked_bias_rows}


def parse(extreme: str) -> tuple[str, list[str]]:
    """``(kind, arguments)`` of an extreme as the module docstring defines it; ``ValueError`` for
    any other string (a saved case is checked against this grammar before it is replayed)."""
    kind, _, rest = str(extreme).partition(":")
    args = rest.split(":", 1) if kind in ("subnormal", "nonfinite") else [rest]
    builder = _BUILDERS.get(kind)
    try:
        if builder is None or builder(*args) != extreme:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"unknown extreme {extreme!r} (known: subnormal:<dtype>:query|value, "
                         f"nonfinite:nan|inf|-inf:<array>, masked-key:nan|inf|-inf, "
                         f"shared:{'|'.join(SHARED)}, {BLOCKED_BIAS_ROWS})") from None
    return kind, args


def apply(case, extreme: str):
    """``case`` with ``extreme`` written into copies of its arrays."""
    kind, args = parse(extreme)
    if kind == "subnormal":
        return _subnormal(case, SMALLEST_NORMAL[args[0]], args[1])
    if kind == "nonfinite":
        return _nonfinite(case, NONFINITE[args[0]], args[1])
    if kind == "masked-key":
        return _masked_key(case, NONFINITE[args[0]])
    if kind == BLOCKED_BIAS_ROWS:
        return _blocked_bias_rows(case)
    return _shared(case, args[0])


def _subnormal(case, tiny: float, which: str):
    # |x| < 2 for about 95% of standard normal draws: x * tiny / 2 is then below tiny
    names = ("q", "query") if which == "query" else ("v", "value")
    scaled = {name: getattr(case, name) * (tiny / 2) for name in names}
    if case.spec.self_attention:
        scaled["query"] = scaled["key"] = scaled["value"] = scaled[names[1]]
    return case._replace(**scaled)


def _nonfinite(case, value: float, array: str):
    rng = np.random.default_rng(case.spec.seed + 1)
    if array in PARAMS:
        params = case.params._asdict()
        if params[array] is None:
            return case
        params[array] = _set_one(params[array], value, rng)
        return case._replace(params=oracle.Params(**params))
    changed = _set_one(getattr(case, array), value, rng)
    if case.spec.self_attention and array in ("query", "key", "value"):
        return case._replace(query=changed, key=changed, value=changed)
    return case._replace(**{array: changed})


def _set_one(x: np.ndarray, value: float, rng: np.random.Generator) -> np.ndarray:
    out = np.array(x, dtype=np.float64)
    if out.size:
        out[np.unravel_index(int(rng.integers(out.size)), out.shape)] = value
    return out


def _masked_key(case, value: float):
    s = case.spec
    allowed = oracle.allowed_mask(s.batch, s.heads, s.len_q, s.len_k, mask=case.mask,
                                  key_padding_mask=case.key_padding_mask, causal=s.causal)
    excluded = (~allowed).sum(axis=(1, 2))  # (B, L_k): rows that exclude each key
    k, key = np.array(case.k), np.array(case.key)
    for b in range(s.batch):
        if s.len_k and excluded[b].max() > 0:
            j = int(np.argmax(excluded[b]))
            k[b, :, j, 0] = value
            key[b, j, 0] = value
    return case._replace(k=k, key=key)


def _shared(case, which: str):
    if which == "key=value":
        if case.key.shape != case.value.shape:
            raise ValueError(f"shared:key=value needs key {case.key.shape} == value {case.value.shape}")
        return case._replace(value=case.key)
    if case.query.shape != case.key.shape:
        raise ValueError(f"shared:query=key needs query {case.query.shape} == key {case.key.shape}")
    return case._replace(key=case.query)


def _blocked_bias_rows(case):
    if case.bias is None:  # a backend without "bias" runs the case without it (harness.fit)
        return case
    if case.bias.ndim < 2 or case.bias.ndim < 2 or case.bias.shape[-2] != case.spec.len_q:
        raise ValueError(f"{BLOCKED_BIAS_ROWS} needs a bias over the L_q = {case.spec.len_q} "
                         f"query rows, got shape {None if case.bias is None else case.bias.shape}")
    rng = np.random.default_rng(case.spec.seed + 4)
    rows = rng.random(case.spec.len_q) < 0.5
    if case.spec.len_q:
        rows[rng.integers(case.spec.len_q)] = True
    bias = np.array(case.bias)
    bias[..., rows, :] = -np.inf
    return case._replace(bias=bias)
