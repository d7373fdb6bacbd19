"""numpy-chunked's blocks: any block sizes, masks cut per head and block, agree with the oracle."""

import numpy as np
import pytest

from mhaspec.backends import np_chunked
from mhaspec.backends.np_chunked import ChunkedNumpyBackend
from mhaspec.spec import oracle


def _case(rng):
    b, h, l_q, l_k, d = (int(x) for x in rng.integers(1, [3, 5, 30, 30, 9]))
    q = rng.standard_normal((b, h, l_q, d)) * 3
    k, v = rng.standard_normal((b, h, l_k, d)), rng.standard_normal((b, h, l_k, d))
    kw = {"mask": rng.random((b, 1, l_q, l_k)) < 0.7 if rng.random() < 0.5 else None,
          "causal": ("top_left", "bottom_right", None)[int(rng.integers(3))],
          "bias": rng.standard_normal((h, l_q, l_k)) if rng.random() < 0.4 else None,
          "key_padding_mask": rng.random((b, l_k)) < 0.8 if rng.random() < 0.4 else None}
    return q, k, v, kw


@pytest.mark.parametrize("block_q, block_k", [(None, None), (1, 1), (3, 4), (7, 2), (64, 5)])
def test_blocks_of_any_size_agree_with_the_oracle(block_q, block_k):
    backend = ChunkedNumpyBackend(block_q=block_q, block_k=block_k)
    rng = np.random.default_rng(0 if block_q is None else block_q * 100 + block_k)
    for _ in range(30):
        q, k, v, kw = _case(rng)
        out, weights = backend.scaled_dot_product_attention(q, k, v, **kw)
        want, _ = oracle.attention(q, k, v, **kw)
        assert weights is None
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


def test_long_rows_are_split_into_key_blocks_and_heads_into_groups(monkeypatch):
    """L_q * L_k above one block: one head per block and several key blocks per query row."""
    monkeypatch.setattr(np_chunked, "BLOCK_ELEMENTS", 100)  # 40 x 40 logits per head: 2 x 40 blocks
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 40, 4)) for _ in range(3))
    out, _ = ChunkedNumpyBackend(block_k=16).scaled_dot_product_attention(q, k, v, causal="bottom_right")
    want, _ = oracle.attention(q, k, v, causal="bottom_right")
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
