"""Which backend capabilities each clause's tests need: a test may name a clause only if it
requires them (a test that names a clause its backend cannot exercise would report a false pass).

:data:`NEEDS` maps clause id -> the capabilities any test of that clause must require (by its
``requires`` markers or the operation ``op`` it is parametrized with). The plugin checks every
collected conformance test against it (:func:`untestable_tags`) and refuses the run otherwise;
``docs/backends.md``'s capability table is checked against it by the project's tests. A clause not
listed needs no capability (the operations it is tested on add theirs).
"""

from __future__ import annotations

from typing import Iterable

_SDPA = frozenset({"sdpa"})
_MHA = frozenset({"mha"})
_MASKS = frozenset({"masks"})
_ERRORS = frozenset({"errors"})

#: clause id -> capabilities every test naming it must require
NEEDS: dict[str, frozenset[str]] = {
    "SHAPE-1": _MHA, "SHAPE-2": frozenset({"weights"}), "SHAPE-3": _SDPA,
    "PARAM-1": _MHA, "PARAM-2": _MHA,
    "HEAD-1": frozenset({"heads"}), "HEAD-2": frozenset({"heads"}),
    "SDPA-1": _SDPA, "SDPA-2": frozenset({"sdpa", "scale"}), "SDPA-3": _SDPA,
    "SDPA-4": frozenset({"sdpa", "weights"}), "SDPA-5": _SDPA, "SDPA-6": _SDPA, "SDPA-7": _SDPA,
    "MASK-1": _MASKS, "MASK-2": frozenset({"masks", "bias"}),
    "MASK-3": frozenset({"masks", "legacy_mask"}), "MASK-5": _MASKS,
    "MASK-6": frozenset({"masks", "causal"}), "MASK-7": frozenset({"masks", "causal"}),
    "MASK-8": frozenset({"masks", "causal"}), "MASK-9": _MASKS, "MASK-10": _MASKS,
    "MASK-11": frozenset({"masks", "bias"}), "MASK-12": _MASKS, "MASK-13": _MASKS,
    "MHA-1": _MHA, "MHA-2": _MHA, "MHA-3": _MHA, "MHA-4": frozenset({"mha", "cross"}),
    "MHA-5": _MHA, "MHA-6": frozenset({"gqa"}),  # grouped heads in either operation (spec 1.2)
    **{f"ERR-{i}": _ERRORS for i in range(1, 11)},
    "ERR-2": frozenset({"errors", "mha"}), "ERR-7": frozenset({"errors", "masks"}),
    "ERR-9": frozenset({"errors", "legacy_mask"}),
    "GRAD-1": frozenset({"grad"}), "GRAD-2": frozenset({"grad", "masks"}),
    # spec 1.2: each chapter needs its feature's capability (GQA-1/2: grouped heads in attention)
    "GQA-1": frozenset({"sdpa", "gqa"}), "GQA-2": frozenset({"sdpa", "gqa"}),
    **{f"SOFTCAP-{i}": frozenset({"softcap"}) for i in (1, 2)},
    **{f"WIN-{i}": frozenset({"window"}) for i in (1, 2, 3)},
    **{f"ALIBI-{i}": frozenset({"alibi"}) for i in (1, 2, 3)},
    **{f"SEG-{i}": frozenset({"segments"}) for i in (1, 2, 3, 4, 5)},
    **{f"CACHE-{i}": frozenset({"kv_cache"}) for i in (1, 2, 3, 4)},
    **{f"LSE-{i}": frozenset({"lse"}) for i in (1, 2)},
    # spec 1.3: the gradient of attention (attention_vjp) and sinks
    **{f"GRAD-{i}": frozenset({"sdpa", "attention_vjp"}) for i in (3, 5, 6, 7)},
    "GRAD-4": frozenset({"sdpa", "attention_vjp", "gqa"}),
    "GRAD-8": frozenset({"sdpa", "attention_vjp", "lse"}),
    "GRAD-9": frozenset({"sdpa", "attention_vjp", "bias", "bias_grad"}),
    **{f"SINK-{i}": frozenset({"sdpa", "sink"}) for i in (1, 2, 4)},
    "SINK-3": frozenset({"sdpa", "sink", "attention_vjp"}),
    # spec 1.4: merging partial states (MERGE-5's test also requires sdpa, lse and causal: its
    # states come from the backend's own attention)
    **{f"MERGE-{i}": frozenset({"merge"}) for i in range(1, 7)},
    **{f"PAGE-{i}": frozenset({"paged"}) for i in range(1, 5)},
    # spec 1.4: 16-bit gradients (the dtypes are the cells), the lse cotangent honoured or refused
    "GRAD-10": frozenset({"sdpa", "attention_vjp"}),
    "GRAD-11": frozenset({"sdpa", "attention_vjp", "lse"}),
    "DET-1": frozenset({"deterministic"}),  # spec 1.4
    **{f"CHUNK-{i}": frozenset({"chunk"}) for i in (1, 2, 3)},  # spec 1.4
}


def untestable_tags(clauses: Iterable[str], required: Iterable[str]) -> dict[str, list[str]]:
    """clause -> the capabilities it needs that ``required`` (a test's ``requires`` markers plus
    its operation) lacks; empty when every clause is exercisable."""
    have = set(required)
    out = {}
    for clause in clauses:
        missing = sorted(NEEDS.get(clause, frozenset()) - have)
        if missing:
            out[clause] = missing
    return out
