"""Under certify a backend's exception arrives in the judging process with its traceback from the
backend's own process (a note below the failure; the message and type as before), control
characters escaped."""

from __future__ import annotations

import numpy as np

from mhaspec.sealed import open_sealed

RAISING = '''
from mhaspec.backends.np_backend import BATCHED


def deep_in_the_backend(q):
    raise ValueError("the kernel refused \\x1b[31m this")


class Raising:
    name = "raising"

    def __getattr__(self, member):
        return getattr(BATCHED, member)

    def scaled_dot_product_attention(self, q, k, v, **kw):
        return deep_in_the_backend(q)


BACKEND = Raising()
'''


def test_the_backends_traceback_travels_with_its_exception(tmp_path, monkeypatch):
    (tmp_path / "raising_backend.py").write_text(RAISING, "utf-8")
    monkeypatch.chdir(tmp_path)
    backend = open_sealed("raising_backend:BACKEND", call_timeout=60)
    try:
        x = backend.asarray(np.ones((1, 1, 2, 4)), dtype="float64")
        try:
            backend.scaled_dot_product_attention(x, x, x)
        except ValueError as exc:
            raised = exc
        else:
            raise AssertionError("the backend's ValueError did not arrive")
    finally:
        backend.close()
    assert "the kernel refused" in str(raised)
    note = "\n".join(getattr(raised, "__notes__", []))
    assert "raised in the backend's process" in note, note
    assert "deep_in_the_backend" in note and "raising_backend.py" in note, note
    assert "\x1b" not in note and "\\x1b" in note, note
