"""The message format between certify and the backend's process (:mod:`mhaspec.wire`): arrays and
JSON round-trip exactly; anything that is not a boolean or numeric array, or a frame that breaks
the format, is refused; a silent or closed peer ends a read at its deadline or at once."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import numpy as np
import pytest

from mhaspec import wire


def through_a_pipe(frame: bytes, deadline: float | None = None, **kwargs):
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, frame), os.close(write)))
    writer.start()
    try:
        return wire.receive(read, deadline, **kwargs)
    finally:
        writer.join()
        os.close(read)


def raw_frame(header: dict, payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + payload


def test_arrays_and_json_round_trip_bit_for_bit():
    arrays = [np.arange(6, dtype=">f8").reshape(2, 3), np.array([True, False]),
              np.float16([1.5, np.nan]), np.int64(7), np.zeros((0, 3), np.float32)]
    header, got = through_a_pipe(wire.encode({"op": "x", "kwargs": {"scale": 0.5}}, arrays))
    assert header == {"op": "x", "kwargs": {"scale": 0.5}}
    for a, b in zip(arrays, got, strict=True):
        a = np.asarray(a)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        assert b.flags.writeable


@pytest.mark.parametrize("array", [np.array([object()]), np.array(["text"]),
                                   np.zeros(2, dtype=[("a", "f8")])], ids=["object", "str", "record"])
def test_an_array_that_is_not_boolean_or_numeric_is_not_sent(array):
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.encode({}, [array])


@pytest.mark.parametrize("arrays", [[["|O8", [1]]], [["<f8", [-1]]], [["<f8", [2**62, 2**62]]],
                                    [["<f8"]], "x", [["<f8", [1.5]]]],
                         ids=["object", "negative", "huge", "no-shape", "not-a-list", "float-dim"])
def test_a_header_describing_other_arrays_is_refused(arrays):
    with pytest.raises(wire.WireError):
        through_a_pipe(raw_frame({"arrays": arrays}, b"\0" * 16))


def test_a_closed_peer_and_a_silent_one_end_the_read():
    with pytest.raises(wire.WireClosed):
        through_a_pipe(wire.encode({}, [np.ones(4)])[:-8])
    read, write = os.pipe()
    os.set_blocking(read, False)
    started = time.monotonic()
    with pytest.raises(wire.WireTimeout):
        wire.receive(read, time.monotonic() + 0.2)
    assert time.monotonic() - started < 5
    os.close(read)
    os.close(write)


def test_a_header_nested_too_deep_is_a_wire_error_not_a_recursion_error():
    """Old: a header of 100,000 nested lists escaped as RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(wire.WireError, match="nests too deep"):
        through_a_pipe(struct.pack("<Q", len(deep)) + deep)


def test_arrays_past_the_cap_are_refused_before_they_are_read():
    """Old: an answer could describe up to 4 GiB, and the judge read all of it."""
    frame = raw_frame({"arrays": [["<f8", [1 << 20]]]})  # 8 MiB described, none sent
    with pytest.raises(wire.WireError, match="at most 1 MiB"):
        through_a_pipe(frame, max_bytes=1 << 20)
    from mhaspec.backend_process import MAX_ANSWER

    assert MAX_ANSWER <= 256 << 20


def test_one_codec_round_trips_every_value_both_ways():
    """The judge's and the backend's process share mhaspec.codec: what one encodes the other
    decodes to an equal value (arrays as leaves), and nothing nests past MAX_DEPTH."""
    from mhaspec import codec
    from mhaspec.backends import AttentionOutputs, MHAParams

    arrays: list = []

    def leaf(x):
        arrays.append(x)
        return {"a": len(arrays) - 1}

    params = MHAParams(*(np.full(2, float(i)) for i in range(len(MHAParams._fields))))
    value = [1, 2.5, "x", None, True, (3, [4]), {"k": (5,)}, params,
             AttentionOutputs(np.ones(2), np.zeros(3)), np.arange(3)]
    sent = json.loads(json.dumps(codec.encode(value, leaf)))
    got = codec.decode(sent, lambda obj: arrays[obj["a"]])
    assert type(got[7]) is MHAParams and type(got[8]) is AttentionOutputs and type(got[5]) is tuple
    assert got[:7] == value[:7]
    assert all(np.array_equal(a, b) for a, b in zip(got[7], params, strict=True))
    assert np.array_equal(got[9], value[9])
    nested = {"t": [1]}
    for _ in range(codec.MAX_DEPTH + 2):
        nested = {"t": [nested]}
    with pytest.raises(codec.CodecError, match="deeper"):
        codec.decode(nested, None)
    with pytest.raises(codec.CodecError, match="tagged"):
        codec.decode({"z": 1}, None)
