"""What a native adapter, not its library, did in a test: the clauses its shared argument
validation satisfied (``validated_by_adapter``) and the features it served by folding them into
the masks (``folded_by_adapter``). The plugin records both in each test's result;
:func:`~.verdicts.satisfied_by` turns them into a clause's ``satisfied_by``."""

from __future__ import annotations

from mhaspec.backends.sub_cases import FOLDED


def validated_by_adapter(backend, clauses: list[str]) -> list[str]:
    """The clauses of a test that the backend's adapter satisfies by its shared validation
    (``validated_clauses``): none when the test names a clause left to the library
    (``library_validates``), whose invalid input then reaches the library."""
    if set(clauses) & set(getattr(backend, "library_validates", ())):
        return []
    return sorted(set(clauses) & set(getattr(backend, "validated_clauses", ())))


def folded_by_adapter(backend) -> list[str]:
    """The capabilities (of :data:`~mhaspec.backends.sub_cases.FOLDED`) the backend's adapter
    served by folding in the test's calls, as its ``folded_by_adapter()`` says (asked after each
    test); none from a backend without it, or one that cannot answer (it died, timed out or raised:
    the library then keeps the credit, as before)."""
    ask = getattr(backend, "folded_by_adapter", None)
    if ask is None:
        return []
    try:
        folds = ask()
    except BaseException as exc:  # noqa: BLE001 - the backend's own code, a timeout, its death
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return []
    return sorted({f for f in folds if isinstance(f, str)} & FOLDED) if isinstance(
        folds, (list, tuple)) else []
