"""Saved failure files of spec 1.2 feature cases: the feature arrays round-trip, integer arrays are
accepted for segment ids and lengths only, and the shapes follow the case (L_K with a cache)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from mhaspec.conformance import failure_file, failure_save
from mhaspec.conformance.strategies import CaseSpec, build_case

from hostile_files import Parametrization, members, rewrite

SEGMENTS = CaseSpec(batch=2, heads=2, len_q=5, len_k=5, d_k=4, d_v=4, seed=3, segments="packed",
                    seq_lengths="both", alibi="per_batch", alignment="bottom_right",
                    window=(1, None), softcap=5.0, lse=True)
CACHE = CaseSpec(batch=2, heads=4, len_q=2, len_k=3, d_k=4, d_v=2, seed=4, kv_heads=2,
                 past_len=11, past_valid=True, mask_shape=(2, 1, 2, 14), key_padding=True,
                 causal="bottom_right")


def _save(tmp_path, spec, name="case.npz"):
    return failure_save.save_case(tmp_path / name, Parametrization(), build_case(spec), op="sdpa",
                                  clause="SEG-1", backend_ref="numpy-batched",
                                  overrides={"causal": "bottom_right"})


@pytest.mark.parametrize("spec", [SEGMENTS, CACHE], ids=["segments", "cache"])
def test_feature_cases_round_trip(tmp_path, spec):
    meta, read = failure_file.read_case(_save(tmp_path, spec))
    case = build_case(spec)
    assert read.spec == spec
    for name, want in case.features._asdict().items():
        got = getattr(read.features, name)
        assert (got is None) == (want is None), name
        if want is not None:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype, name
    assert read.k.shape == case.k.shape
    if spec.key_padding:  # over the present cache's L_K = L_past + L_k keys
        assert read.key_padding_mask.shape == (spec.batch, spec.past_len + spec.len_k)


@pytest.mark.parametrize("field", ["q_segment_ids", "query_seq_lengths"])
def test_integer_fields_refuse_float_and_unsigned_arrays(tmp_path, field):
    path = _save(tmp_path, SEGMENTS)
    shape = build_case(SEGMENTS).features._asdict()[field].shape
    for bad in (np.zeros(shape), np.zeros(shape, np.uint64)):
        with pytest.raises(failure_file.FailureFileError, match=f"'{field}' must be int32 or int64"):
            failure_file.read_case(rewrite(path, **{field: bad}))


def test_int32_ids_are_read_as_they_are(tmp_path):
    ids = build_case(SEGMENTS).features.kv_segment_ids.astype(np.int32)
    _, read = failure_file.read_case(rewrite(_save(tmp_path, SEGMENTS), kv_segment_ids=ids))
    assert read.features.kv_segment_ids.dtype == np.int32


@pytest.mark.parametrize("field", ["past_key", "alibi_slopes"])
def test_float_feature_fields_still_refuse_integer_arrays(tmp_path, field):
    spec = CACHE if field == "past_key" else SEGMENTS
    path = _save(tmp_path, spec)
    shape = build_case(spec).features._asdict()[field].shape
    with pytest.raises(failure_file.FailureFileError, match=f"'{field}' must be float16/32/64"):
        failure_file.read_case(rewrite(path, **{field: np.zeros(shape, np.int64)}))


def test_a_feature_array_the_case_does_not_have_is_refused(tmp_path):
    path = _save(tmp_path, CACHE)
    with pytest.raises(failure_file.FailureFileError, match="'q_segment_ids' present"):
        failure_file.read_case(rewrite(path, q_segment_ids=np.zeros((2, 2), np.int64)))


def test_a_missing_cache_array_is_refused(tmp_path):
    path = _save(tmp_path, CACHE)
    content = members(path)
    del content["past_value.npy"]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            z.writestr(name, data)
    with pytest.raises(failure_file.FailureFileError, match="past_value"):
        failure_file.read_case(path)
