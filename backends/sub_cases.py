"""Sub-cases of a capability: a backend that supports part of a capability says which part.

A backend's optional ``sub_cases`` maps a capability to a rule over the keyword arguments of a
call (their protocol names, :data:`ARGUMENTS`), plain data so that it crosses a process boundary:

* ``"with"``: arguments a call using the capability must also give (a window only with
  ``causal``);
* ``"without"``: arguments it must not give (a soft-cap but no ``mask``);
* ``"generic"``: arguments that send a supported call through the generic explicit-mask path
  (the adapter folds the feature into a boolean mask) instead of the library's own mechanism;
* ``"shapes"``: conditions on the call's sizes a call using the capability must meet
  (:data:`SHAPES`: a cache only with ``d_v == d_k``). The capability may also be an operation,
  ``"sdpa"`` or ``"mha"``: a rule every call of it must meet
  (``{"sdpa": {"shapes": ("d_k <= 256",)}}``).

A call using the capability that breaks the rule is not implemented: the suite reports it so
(never as a pass or a failure) and does not call the backend. A backend that raises
``NotImplementedError`` for a call its rules allow fails: what it cannot do, it states here first.
Example::

    sub_cases = {"window": {"with": ("causal",), "generic": ("q_segment_ids",)},
                 "kv_cache": {"shapes": ("d_v == d_k",)}}

Axis legend of the sizes: h query heads, g key/value heads, L_q / L_k query / key lengths,
d_k / d_v per-head key / value widths.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple

#: capability -> the call arguments whose presence means a call uses it
USES: dict[str, tuple[str, ...]] = {
    "masks": ("mask", "key_padding_mask"),
    "bias": ("bias",),
    "legacy_mask": ("legacy_mask",),
    "causal": ("causal",),
    "scale": ("scale",),
    "softcap": ("softcap",),
    "window": ("window",),
    "chunk": ("chunk",),
    "alibi": ("alibi_slopes",),
    "segments": ("q_segment_ids", "kv_segment_ids", "query_seq_lengths", "key_value_seq_lengths"),
    "kv_cache": ("past_key", "past_value"),
    "lse": ("lse",),
}
#: The capabilities a native adapter's generic path serves itself when the library's own arguments
#: do not (``attention_features`` / ``mha_features`` answer ``NotImplemented``): windows, chunks,
#: segments and lengths folded into the boolean mask, ALiBi's bias computed, the KV cache laid out
#: before the op is called, sinks merged through the op's log-sum-exp. A pass of their clauses is
#: then the adapter's, and the certificate says so (``folded_by_adapter``, "pass (adapter fold)").
FOLDED = frozenset({"window", "chunk", "segments", "alibi", "kv_cache", "sink"})
#: the argument names a rule may use
ARGUMENTS = frozenset(a for names in USES.values() for a in names) | {"alignment", "num_kv_heads"}
#: the operations a rule may name as its capability (every call of it uses it)
OPERATIONS = ("sdpa", "mha")


class Sizes(NamedTuple):
    """The sizes of a call that :data:`SHAPES` test (axis legend in the module docstring)."""

    heads: int
    kv_heads: int
    len_q: int
    len_k: int
    d_k: int
    d_v: int


#: the shape conditions a rule's ``"shapes"`` may name -> (the test on a call's :class:`Sizes`,
#: how a call that breaks it is described)
SHAPES: dict[str, tuple[Callable[[Sizes], bool], str]] = {
    "d_v == d_k": (lambda s: s.d_v == s.d_k, "d_v != d_k"),
    "L_q == L_k": (lambda s: s.len_q == s.len_k, "L_q != L_k"),
    "L_q == 1": (lambda s: s.len_q == 1, "L_q > 1"),
    "g == h": (lambda s: s.kv_heads == s.heads, "grouped key/value heads (g < h)"),
    "d_k <= 256": (lambda s: s.d_k <= 256, "d_k > 256"),
}
#: the keys of a rule
KEYS = ("with", "without", "generic", "shapes")


def check_rules(rules) -> dict[str, dict[str, tuple[str, ...]]]:
    """``rules`` (a backend's ``sub_cases``) as plain data; ``ValueError`` naming the member when
    a capability, key or argument is unknown."""
    if not isinstance(rules, Mapping):
        raise ValueError(f"sub_cases must map capabilities to rules, got {type(rules).__name__}")
    out = {}
    for capability, rule in rules.items():
        if capability not in USES and capability not in OPERATIONS:
            raise ValueError(f"sub_cases: unknown capability {capability!r} "
                             f"(known: {', '.join(sorted(USES) + list(OPERATIONS))})")
        if not isinstance(rule, Mapping) or set(rule) - set(KEYS):
            raise ValueError(f"sub_cases[{capability!r}] must map some of {KEYS} to argument names")
        out[capability] = {}
        for key, names in rule.items():
            names = (names,) if isinstance(names, str) else tuple(names)
            known, what = (set(SHAPES), "shape conditions") if key == "shapes" else (ARGUMENTS,
                                                                                   "arguments")
            unknown = sorted(set(names) - known)
            if unknown:
                raise ValueError(f"sub_cases[{capability!r}][{key!r}]: unknown {what} {unknown}"
                                 + (f" (known: {', '.join(SHAPES)})" if key == "shapes" else ""))
            out[capability][key] = names
    return out


def judge(rules: Mapping, given: Iterable[str], op: str | None = None,
          sizes: Sizes | None = None) -> tuple[list[str], dict[str, str]]:
    """For a call of ``op`` giving the arguments ``given``, of ``sizes`` (None: shapes not judged):
    the sub-cases it uses that ``rules`` leave unsupported (``"window without causal"``,
    ``"kv_cache with d_v != d_k"``), and capability -> ``"library"`` or ``"generic"`` for the
    supported features the rules name."""
    given = set(given)
    missing, paths = [], {}
    for capability, rule in rules.items():
        if capability != op and given.isdisjoint(USES.get(capability, ())):
            continue
        broken = [f"without {a}" for a in rule.get("with", ()) if a not in given] + [
            f"with {a}" for a in rule.get("without", ()) if a in given] + [
            f"with {SHAPES[c][1]}" for c in rule.get("shapes", ())
            if sizes is not None and not SHAPES[c][0](sizes)]
        if broken:
            missing.append(f"{capability} {' and '.join(broken)}")
        elif capability in USES:
            paths[capability] = "generic" if given & set(rule.get("generic", ())) else "library"
    return missing, paths
