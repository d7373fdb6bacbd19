"""Backends of the catalogue (``broken_backends/``) that declare their mistake as a deviation of
the clause it breaks: the suite must report it under that clause only (conformance/governed.py)
and judge every other clause on what the backend does right. Loaded with ``--backend
declared_backends:<NAME>``."""

from __future__ import annotations

import broken_backends as broken


def _declaring(backend, clauses: tuple[str, ...], reason: str):
    backend.deviations = {clause: reason for clause in clauses}
    return backend


#: SEG-3 (causal, window and ALiBi counted within a segment) draws windows too, and the same
#: off-by-one shows there: the backend declares both
WINDOW_OFF_BY_ONE_DECLARED = _declaring(
    broken.WindowOffByOne("declared-window-off-by-one"), ("WIN-1", "SEG-3"),
    "the window admits one key more on the left (j >= i - left - 1)")
#: ALIBI-2 (ALiBi equals its explicit bias) is broken by the same sign: its test is about ALiBi
#: (it requires "alibi") and keeps it, so the backend declares both
ALIBI_SIGN_FLIPPED_DECLARED = _declaring(
    broken.AlibiSignFlipped("declared-alibi-sign"), ("ALIBI-1", "ALIBI-2"),
    "ALiBi adds +m|i - j|")
#: GRAD-11 allows refusing a non-zero d_lse; the refusal is a deviation from GRAD-8
LSE_COTANGENT_REFUSED_DECLARED = _declaring(
    broken.LseCotangentRefused("declared-dlse-refused"), ("GRAD-8",),
    "a non-zero d_lse raises NotImplementedError (GRAD-11's refusal)")
#: GRAD-7 governs the gradients a row with no allowed key reaches: its NaN dq row, and the NaN dk
#: and dv of its batch item and key/value head, are judged by GRAD-7 alone, not by every gradient
#: clause whose case empties a row
EMPTY_ROWS_NAN_BACKWARD_DECLARED = _declaring(
    broken.EmptyRowsNanInTheBackward("declared-empty-rows-nan-backward"), ("GRAD-7",),
    "a query row with no allowed key gets NaN in dq, and dk and dv of its batch item and head are "
    "NaN (the backward of a softmax over a row of -inf)")
#: backend name -> the clauses it declares
DECLARED = {"declared-window-off-by-one": {"WIN-1", "SEG-3"}, "declared-alibi-sign": {"ALIBI-1", "ALIBI-2"},
            "declared-dlse-refused": {"GRAD-8"},
            "declared-empty-rows-nan-backward": {"GRAD-7"}}
