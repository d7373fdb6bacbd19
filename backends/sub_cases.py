"""Sub-cases of a capability: a backend that supports part of a capability says which part.

A backend's optional ``sub_cases`` maps a capability to a rule over the keyword arguments of a
call (their protocol names, :data:`ARGUMENTS`), plain data so that it crosses a process boundary:

* ``"with"``: arguments a call using the capability must also give (a window only with
  ``causal``);
* ``"without"``: arguments it must not give (a soft-cap but no ``mask``);
* ``"generic"``: arguments that send a supported call through the generic explicit-mask path
  (the adapter folds the feature into a boolean mask) instead of the library's own mechanism.

A call using the capability that breaks the rule is not implemented: the suite reports it so
(never as a pass or a failure) and does not call the backend. Example::

    sub_cases = {"window": {"with": ("causal",), "generic": ("q_segment_ids",)}}
"""

from __future__ import annotations

from typing import Iterable, Mapping

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
#: the keys of a rule
KEYS = ("with", "without", "generic")


def check_rules(rules) -> dict[str, dict[str, tuple[str, ...]]]:
    """``rules`` (a backend's ``sub_cases``) as plain data; ``ValueError`` naming the member when
    a capability, key or argument is unknown."""
    if not isinstance(rules, Mapping):
        raise ValueError(f"sub_cases must map capabilities to rules, got {type(rules).__name__}")
    out = {}
    for capability, rule in rules.items():
        if capability not in USES:
            raise ValueError(f"sub_cases: unknown capability {capability!r} "
                             f"(known: {', '.join(sorted(USES))})")
        if not isinstance(rule, Mapping) or set(rule) - set(KEYS):
            raise ValueError(f"sub_cases[{capability!r}] must map some of {KEYS} to argument names")
        out[capability] = {}
        for key, names in rule.items():
            names = (names,) if isinstance(names, str) else tuple(names)
            unknown = sorted(set(names) - ARGUMENTS)
            if unknown:
                raise ValueError(f"sub_cases[{capability!r}][{key!r}]: unknown arguments {unknown}")
            out[capability][key] = names
    return out


def judge(rules: Mapping, given: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """For a call giving the arguments ``given``: the sub-cases it uses that ``rules`` leave
    unsupported (``"window without causal"``), and capability -> ``"library"`` or ``"generic"``
    for the supported ones the rules name."""
    given = set(given)
    missing, paths = [], {}
    for capability, rule in rules.items():
        if given.isdisjoint(USES[capability]):
            continue
        broken = [f"without {a}" for a in rule.get("with", ()) if a not in given] + [
            f"with {a}" for a in rule.get("without", ()) if a in given]
        if broken:
            missing.append(f"{capability} {' and '.join(broken)}")
        else:
            paths[capability] = "generic" if given & set(rule.get("generic", ())) else "library"
    return missing, paths
