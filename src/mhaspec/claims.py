"""A backend's claims, read once, checked for type and frozen: what ``mhaspec certify`` uses for
parametrizing the suite, judging and the certificate alike.

The backend's process reads them (:func:`mhaspec.backend_host.read_claims`, plain JSON); here
:func:`checked` turns that JSON into a :class:`Claims` or raises :class:`ClaimError` naming the member
and what is wrong with it (a usage error of certify, before the run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from mhaspec.backends import ALL_DTYPES, CAPABILITIES, behaviours
from mhaspec.backends.claim_readers import OPS
from mhaspec.backends.serving import MERGE_CONVENTIONS
from mhaspec.backends.sub_cases import check_rules
from mhaspec.spec import load as load_spec

class ClaimError(ValueError):
    """A claim of the wrong type or value (one line, naming the member)."""


@dataclass(frozen=True)
class Claims:
    """Everything a backend says about itself. ``devices``: device -> None when usable, else the
    reason; ``dtypes``: usable device -> dtypes; ``capabilities_for``: op -> capabilities, None
    when the backend does not scope them; ``deviations_on``: usable device -> dtype -> clause key ->
    reason; ``precision_flags``: usable device -> flag -> value; ``validated_clauses`` and
    ``library_validates``: an adapter's clauses satisfied by its shared argument validation and
    those it leaves to its library (:mod:`mhaspec.backends.adapters`); ``sub_cases``: the parts of
    capabilities it supports (:mod:`mhaspec.backends.sub_cases`); ``device_names``: usable
    device -> its readable name (:func:`mhaspec.backend_host.device_name`); ``merge_conventions``:
    argument -> the values ``merge_states`` accepts (MERGE-3), None when the backend declares none
    (LSE-1's conventions alone); ``page_size_unit``: the page sizes ``paged_attention`` takes are
    its multiples (PAGE-1; 1: every size); ``reports_folds``: whether it answers
    ``folded_by_adapter()`` (an adapter, :mod:`mhaspec.backends.adapters`)."""

    name: str
    framework: str
    framework_version: str
    protocol_version: int
    capabilities: frozenset
    capabilities_for: Mapping[str, frozenset] | None
    deviations: Mapping[str, str]
    devices: Mapping[str, str | None]
    dtypes: Mapping[str, tuple[str, ...]]
    deviations_on: Mapping[str, Mapping[str, Mapping[str, str]]]
    precision_flags: Mapping[str, Mapping[str, object]]
    validated_clauses: frozenset = frozenset()
    library_validates: frozenset = frozenset()
    sub_cases: Mapping[str, Mapping[str, tuple[str, ...]]] = field(
        default_factory=lambda: MappingProxyType({}))
    device_names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    merge_conventions: Mapping[str, tuple[str, ...]] | None = None
    page_size_unit: int = 1
    reports_folds: bool = False


def _str(what: str, v) -> str:
    if not isinstance(v, str) or not v:
        raise ClaimError(f"{what} must be a non-empty string, got {_kind(v)}")
    return v


def _kind(v) -> str:
    if isinstance(v, dict) and set(v) == {"!"}:
        return f"a {v['!']}"
    return f"{type(v).__name__} {v!r:.60}"


def _names(what: str, v, allowed) -> frozenset:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ClaimError(f"{what} must be a set of strings, got {_kind(v)}")
    unknown = sorted(set(v) - set(allowed))
    if unknown:
        raise ClaimError(f"{what} names unknown values {unknown}")
    return frozenset(v)


def _clause_ids(what: str, v) -> frozenset:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ClaimError(f"{what} must be a set of clause ids, got {_kind(v)}")
    return frozenset(v)


def _ordered(what: str, v) -> tuple[str, ...]:
    """Dtype names in the backend's order, each once."""
    _names(what, v, ALL_DTYPES)
    return tuple(dict.fromkeys(v))


def _reasons(what: str, v) -> Mapping[str, str]:
    if not isinstance(v, dict):
        raise ClaimError(f"{what} must be a mapping of clause to reason, got {_kind(v)}")
    known = clause_ids()
    for key, reason in v.items():
        if not isinstance(reason, str):
            raise ClaimError(f"{what}[{key!r}] must be a string (the reason), got {_kind(reason)}")
        if key.partition("@")[0] not in known and not behaviours.known(key):
            raise ClaimError(f"{what} names {key[:60]!r}, which is no clause of the spec "
                             f"(ID or ID@operation) nor a behaviour ({behaviours.listing()})")
    return MappingProxyType(dict(v))


@functools.cache
def clause_ids() -> frozenset[str]:
    """The ids of the current spec's clauses (what a deviation may name)."""
    return frozenset(c.id for c in load_spec().clauses)


def _flags(what: str, v) -> Mapping[str, object]:
    if not isinstance(v, dict) or any(isinstance(x, (dict, list)) for x in v.values()):
        raise ClaimError(f"{what} must be a mapping of flag name to a plain value, got {_kind(v)}")
    return MappingProxyType(dict(v))


def checked(raw: dict) -> Claims:
    """The :class:`Claims` of the JSON the backend's process sent; :class:`ClaimError` when a
    member has the wrong type (a ``bool`` is no protocol version) or names unknown values."""
    version = raw.get("protocol_version")
    if type(version) is not int:
        raise ClaimError(f"protocol_version must be an integer, got {_kind(version)}")
    devices = raw.get("devices")
    if not isinstance(devices, dict) or not devices or not all(
            w is None or isinstance(w, str) for w in devices.values()):
        raise ClaimError(f"devices() must map device names to None or a reason, got {_kind(devices)}")
    for name in devices:
        if not name or "/" in name or not name.isprintable():
            raise ClaimError(f"devices() names {name[:60]!r}: a device name is printable, not "
                             f"empty and has no '/' (a cell is written device/dtype)")
    capabilities = _names("capabilities", raw.get("capabilities"), CAPABILITIES)
    scoped = raw.get("capabilities_for")
    if scoped is not None:
        scoped = MappingProxyType({op: _names(f"capabilities_for({op!r})", scoped.get(op),
                                              CAPABILITIES) for op in OPS})
    dtypes = {d: _ordered(f"dtypes({d!r})", raw.get("dtypes", {}).get(d))
              for d, why in devices.items() if why is None}
    on = raw.get("deviations_on", {})
    return Claims(
        name=_str("name", raw.get("name")), framework=_str("framework", raw.get("framework")),
        framework_version=_str("framework_version()", raw.get("framework_version")),
        protocol_version=version, capabilities=capabilities, capabilities_for=scoped,
        deviations=_reasons("deviations", raw.get("deviations")),
        devices=MappingProxyType(dict(devices)), dtypes=MappingProxyType(dtypes),
        deviations_on=MappingProxyType({
            d: MappingProxyType({t: _reasons(f"deviations_on({d!r}, {t!r})", on.get(d, {}).get(t))
                                 for t in ts}) for d, ts in dtypes.items()}),
        precision_flags=MappingProxyType({
            d: _flags(f"precision_flags({d!r})", raw.get("precision_flags", {}).get(d))
            for d in dtypes}),
        validated_clauses=_clause_ids("validated_clauses", raw.get("validated_clauses", [])),
        library_validates=_clause_ids("library_validates", raw.get("library_validates", [])),
        sub_cases=_sub_cases(raw.get("sub_cases", {})),
        merge_conventions=_merge_conventions(raw.get("merge_conventions")),
        page_size_unit=_page_size_unit(raw.get("page_size_unit", 1)),
        reports_folds=raw.get("reports_folds") is True,
        device_names=MappingProxyType({
            d: _str(f"the name of device {d!r}", raw.get("device_names", {}).get(d))[:200]
            for d in dtypes}))


def _page_size_unit(v) -> int:
    """A backend's ``page_size_unit`` (PAGE-1): a positive int (not a bool)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ClaimError(f"page_size_unit must be a positive integer, got {_kind(v)}")
    return v


def _merge_conventions(v) -> Mapping[str, tuple[str, ...]] | None:
    """A backend's ``merge_conventions`` (argument -> accepted values, MERGE-3), checked and
    frozen; None stays None."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ClaimError(f"merge_conventions must be a mapping of argument to values, got {_kind(v)}")
    unknown = sorted(set(v) - set(MERGE_CONVENTIONS))
    if unknown:
        raise ClaimError(f"merge_conventions names unknown arguments {unknown} "
                         f"(known: {sorted(MERGE_CONVENTIONS)})")
    return MappingProxyType({name: tuple(sorted(_names(f"merge_conventions[{name!r}]", values,
                                                       MERGE_CONVENTIONS[name]),
                                                key=MERGE_CONVENTIONS[name].index))
                             for name, values in v.items()})


def _sub_cases(v) -> Mapping:
    """A backend's ``sub_cases`` (:mod:`mhaspec.backends.sub_cases`), checked and frozen."""
    try:
        rules = check_rules(v)
    except ValueError as exc:
        raise ClaimError(str(exc)) from None
    return MappingProxyType({c: MappingProxyType(r) for c, r in rules.items()})
