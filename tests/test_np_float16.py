"""The vectorised float16 product equals NumPy's own float16 matmul bit for bit."""

import numpy as np
import pytest

from mhaspec.backends import np_float16


def _random_pair(rng, a_shape, b_shape):
    scale = 10.0 ** rng.uniform(-3, 2)
    a = (rng.standard_normal(a_shape) * scale).astype(np.float16)
    b = rng.standard_normal(b_shape).astype(np.float16)
    return a, b


@pytest.mark.parametrize("seed", range(8))
def test_equals_numpy_float16_matmul_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, d, m = (int(x) for x in rng.integers(1, 90, 3))
        lead = tuple(int(x) for x in rng.integers(1, 4, rng.integers(0, 3)))
        b_lead = lead if rng.random() < 0.5 else ()
        a, b = _random_pair(rng, lead + (n, d), b_lead + (d, m))
        got, want = np_float16.matmul(a, b), np.matmul(a, b)
        assert got.dtype == want.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_equals_numpy_on_the_source_documents_projection():
    """(32, 50, 512) @ (512, 512): a float32 BLAS product rounded once differs here."""
    rng = np.random.default_rng(2017)
    a, b = _random_pair(rng, (32, 50, 512), (512, 512))
    want = np.matmul(a, b)
    np.testing.assert_array_equal(np_float16.matmul(a, b).view(np.uint16), want.view(np.uint16))
    blas = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    assert not np.array_equal(blas, want)  # so the sequential float32 sum is what NumPy does


def test_special_values():
    a = np.array([[np.inf, 1.0], [-0.0, 60000.0], [np.nan, 0.0]], dtype=np.float16)
    b = np.array([[0.0, 1.0], [-1.0, 2.0]], dtype=np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = np_float16.matmul(a, b), np.matmul(a, b)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("a_shape, b_shape", [((2, 0), (0, 3)), ((0, 3, 4), (0, 4, 5)),
                                              ((2, 0, 4), (4, 5)), ((2, 3, 4), (2, 4, 0)),
                                              ((3, 1, 2, 4), (5, 4, 2))])
def test_empty_and_broadcast_shapes(a_shape, b_shape):
    rng = np.random.default_rng(0)
    a, b = _random_pair(rng, a_shape, b_shape)
    got, want = np_float16.matmul(a, b), np.matmul(a, b)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_mismatched_inner_widths_raise_naming_the_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        np_float16.matmul(np.zeros((2, 3), np.float16), np.zeros((4, 5), np.float16))
