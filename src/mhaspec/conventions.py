"""Confirm the conventions the native adapters translate: where a framework's op differs from the
spec by convention (mask polarity, causal alignment, layout, argument order), the adapter
translates, and this module shows that the translation is needed (mask polarity: True means
blocked; mask form: the mask is added to the logits). For each declared convention it
calls the adapter on a case that exercises it, once as shipped (must agree with the oracle under
NUM-3) and once with that translation switched off (``adapter.untranslated(key)``: must not).

``mhaspec conventions`` prints the table; ``mhaspec matrix`` renders it.
"""

from __future__ import annotations

from typing import NamedTuple

from mhaspec import usage
from mhaspec.backends import loadable

from mhaspec.conformance import harness
from mhaspec.conformance.strategies import CaseSpec

#: A case per convention that the untranslated call gets wrong (float32, on the CPU).
CASES = {
    "mask-polarity": CaseSpec(batch=2, heads=2, len_q=3, len_k=4, mask_shape=(2, 2, 3, 4),
                              key_padding=True, seed=1),
    "mask-form": CaseSpec(batch=2, heads=2, len_q=3, len_k=4, mask_shape=(2, 2, 3, 4),
                          key_padding=True, seed=1),
    "causal-alignment": CaseSpec(batch=2, heads=2, len_q=3, len_k=5, causal="bottom_right", seed=2),
    "layout": CaseSpec(batch=2, heads=3, len_q=4, len_k=5, seed=3),
    "argument-order": CaseSpec(batch=2, heads=2, len_q=3, len_k=4, d_model=8, k_dim=6, v_dim=6,
                               seed=4),
    # one integer sliding_window = W for W keys (Hugging Face, gemma_pytorch, xformers, vLLM) is
    # window=(W - 1, 0); passing the left side as W is one key short (docs/conventions.md)
    "window-size": CaseSpec(batch=2, heads=2, len_q=6, len_k=6, causal="bottom_right",
                            window=(2, 0), seed=5),
}


class Confirmation(NamedTuple):
    adapter: str
    convention: str
    clause: str
    explanation: str
    translated: str  # "agrees" or what went wrong
    untranslated: str  # what the op does with the spec's arguments as they are
    confirmed: bool


def _outcome(impl: harness.Cell, spec: CaseSpec, op: str, clause: str) -> tuple[bool, str]:
    """(the output agrees with the oracle under NUM-3 (:func:`harness.check`), a short
    description). A convention is about the output: the weights are not judged."""
    case = impl.case(spec, op)
    try:
        got = harness.run(impl, op, case)
    except Exception as exc:  # noqa: BLE001 - an exception is one way to differ
        return False, f"raises {type(exc).__name__}"
    (_, out), *_ = harness.check(impl, case, got._replace(weights=None), op=op, clause=clause)
    if out.ok:
        return True, f"agrees (max error {out.error:.1e})"
    return False, (f"output differs from the oracle by up to {out.error:.2g} "
                   f"(allowed {out.allowed:.1e})")


def confirm(adapter) -> list[Confirmation]:
    """Check every convention ``adapter`` declares."""
    rows = []
    op = "sdpa" if "sdpa" in adapter.capabilities else "mha"
    dtype = "float32" if "float32" in adapter.dtypes("cpu") else adapter.dtypes("cpu")[0]
    for key, (clause, explanation) in sorted(getattr(adapter, "conventions", {}).items()):
        spec = CASES[key]
        ok, shipped = _outcome(harness.Cell(adapter, "cpu", dtype), spec, op, clause)
        bad, raw = _outcome(harness.Cell(adapter.untranslated(key), "cpu", dtype), spec, op, clause)
        rows.append(Confirmation(adapter.name, key, clause, explanation, shipped, raw,
                                 ok and not bad))
    return rows


def _adapters(refs: list[str]) -> tuple[list, list[str]]:
    """The named backends, or every registered one that declares conventions and whose framework
    imports; and the names of the registered ones left out because their framework does not."""
    if refs:
        return [usage.checked_backend(ref) for ref in refs], []
    found = loadable()
    loaded, skipped = [], list(found.failures)
    for name, backend in found.backends.items():
        try:
            backend.framework_version()
        except ImportError:
            skipped.append(name)  # its framework is not installed (or does not import)
            continue
        if getattr(backend, "conventions", None):
            loaded.append(backend)
    return loaded, sorted(skipped)


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec conventions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", nargs="*",
                        help="adapters to check (default: every registered backend that declares "
                             "conventions and whose framework imports)")
    args = parser.parse_args(argv)
    adapters, skipped = _adapters(args.backend)
    rows = [r for adapter in adapters for r in confirm(adapter)]
    for r in rows:
        print(f"{r.adapter:12} {r.convention:17} {r.clause:8} "
              f"{'confirmed' if r.confirmed else 'NOT CONFIRMED'}: untranslated {r.untranslated}; "
              f"as shipped {r.translated}")
    if skipped:
        print(f"not checked (framework not installed): {', '.join(skipped)}")
    return 0 if all(r.confirmed for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
