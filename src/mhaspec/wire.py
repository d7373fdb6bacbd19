"""The message format between ``mhaspec certify`` and its backend process: plain JSON and arrays.

One message is a frame: 8 bytes (little-endian length of the header), the header as UTF-8 JSON
(an object), then the raw bytes of each array its ``"arrays"`` list describes as ``[dtype, shape]``
(``dtype`` a NumPy type string such as ``"<f8"`` or ``"|b1"``: booleans, integers, floats and
complex only; C order). Nothing either side sends is ever unpickled: an array is rebuilt from its
bytes by ``np.frombuffer`` with a checked dtype and shape. Reading and writing a non-blocking
descriptor take a deadline (``time.monotonic()`` seconds, None: none) and raise
:class:`WireTimeout` past it, :class:`WireClosed` when the other side has gone, :class:`WireError`
for a frame that breaks the format or an array of another kind.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time

import numpy as np

#: the largest header and the largest message this format accepts (bytes)
MAX_HEADER = 16 << 20
MAX_MESSAGE = 4 << 30


class WireError(Exception):
    """A frame that breaks the format (one line)."""


class WireClosed(WireError):
    """The other side closed its end (it exited or died)."""


class WireTimeout(WireError):
    """The deadline passed before the frame was read or written."""


#: the dtypes an array may have: booleans, integers, floats, complex, any byte order
DTYPE = re.compile(r"[<>|=][biufc][0-9]{1,2}")


def encode(header: dict, arrays: list[np.ndarray] = ()) -> bytes:
    """The frame of ``header`` (JSON-serialisable) and ``arrays`` (NumPy arrays of :data:`DTYPE`)."""
    arrays = [np.asarray(a) for a in arrays]
    for a in arrays:
        if not DTYPE.fullmatch(a.dtype.str):
            raise WireError(f"arrays of dtype {a.dtype} cannot be sent (booleans and numbers only)")
    described = [[a.dtype.str, list(a.shape)] for a in arrays]
    head = json.dumps({**header, "arrays": described}).encode("utf-8")
    return b"".join([struct.pack("<Q", len(head)), head, *(a.tobytes() for a in arrays)])


def send(fd: int, header: dict, arrays: list[np.ndarray] = (), deadline: float | None = None) -> None:
    """Write one frame to the file descriptor ``fd`` (blocking or not)."""
    view = memoryview(encode(header, arrays))
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:  # a non-blocking pipe that is full: wait for the reader
            _wait(fd, deadline, write=True)
            continue
        except (BrokenPipeError, ConnectionResetError):
            raise WireClosed("the other side closed the pipe") from None
        view = view[n:]


def receive(fd: int, deadline: float | None = None,
            max_bytes: int = MAX_MESSAGE) -> tuple[dict, list[np.ndarray]]:
    """Read one frame from ``fd``: its header (without ``"arrays"``) and its arrays, refused
    (:class:`WireError`, before they are read) when they come to more than ``max_bytes``."""
    (size,) = struct.unpack("<Q", _read(fd, 8, deadline))
    if size > MAX_HEADER:
        raise WireError(f"header of {size} bytes (at most {MAX_HEADER})")
    try:
        header = json.loads(_read(fd, size, deadline).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    except RecursionError:
        raise WireError("header nests too deep") from None
    described = header.pop("arrays", None) if isinstance(header, dict) else None
    if not isinstance(described, list):
        raise WireError("header is not an object with a list of arrays")
    layouts, total = [], 0
    for entry in described:
        try:
            dtype, shape = entry
            if not DTYPE.fullmatch(dtype) or not all(type(n) is int and n >= 0 for n in shape):
                raise ValueError
            dtype = np.dtype(dtype)
            size = dtype.itemsize * math.prod(shape)
        except (TypeError, ValueError):
            raise WireError(f"array description {entry!r:.100} is not [dtype, shape] of a boolean or "
                            f"numeric array") from None
        total += size
        if total > max_bytes:
            raise WireError(f"arrays of more than {max_bytes} bytes (at most {max_bytes >> 20} MiB)")
        layouts.append((dtype, shape, size))
    arrays = [np.frombuffer(bytearray(_read(fd, size, deadline)), dtype).reshape(shape)
              for dtype, shape, size in layouts]
    return header, arrays


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:  # a non-blocking pipe that is empty: wait for the writer
            _wait(fd, deadline, write=False)
            continue
        if not chunk:
            raise WireClosed("the other side closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float | None, *, write: bool) -> None:
    """Wait until ``fd`` is ready, or raise :class:`WireTimeout` at ``deadline``."""
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise WireTimeout("deadline passed")
        ready = select.select([], [fd], [], left) if write else select.select([fd], [], [], left)
        if ready[0] or ready[1]:
            return
