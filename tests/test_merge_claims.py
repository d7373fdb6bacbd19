"""The lse conventions a backend's merge_states accepts (MERGE-3, ``merge_conventions``) cross the
sealed path with its other claims, checked like them; without them a sealed backend was judged
on LSE-1's conventions alone (base 2, +inf and the tokens layout reported not implemented)."""

from __future__ import annotations

import pytest

from mhaspec.backend_host import read_claims
from mhaspec.backends import load_backend, serving
from mhaspec.claims import ClaimError, checked


def _sealed_view(claims):
    """What the judging process's SealedBackend exposes of the conventions."""
    return type("Sealed", (), {"merge_conventions": claims.merge_conventions})()


def test_a_backends_merge_conventions_reach_the_judging_process():
    backend = load_backend("numpy-batched")
    claims = checked(read_claims(backend))
    assert serving.conventions_of(_sealed_view(claims)) == serving.conventions_of(backend)
    assert serving.conventions_of(_sealed_view(claims))["lse_base"] == ("e", "2")


def test_a_backend_declaring_none_is_judged_on_lse_1s_conventions():
    class Plain:
        pass
    claims = checked({**read_claims(load_backend("numpy-batched")), "merge_conventions": None})
    assert claims.merge_conventions is None
    assert serving.conventions_of(_sealed_view(claims)) == serving.conventions_of(Plain())


@pytest.mark.parametrize("declared, words", [
    ({"lse_base": ["10"]}, ["merge_conventions['lse_base']", "'10'"]),
    ({"base": ["e"]}, ["merge_conventions", "unknown arguments", "'base'"]),
    (["e"], ["merge_conventions", "mapping"])])
def test_merge_conventions_of_the_wrong_kind_are_a_claim_error(declared, words):
    raw = {**read_claims(load_backend("numpy-batched")), "merge_conventions": declared}
    with pytest.raises(ClaimError) as err:
        checked(raw)
    assert all(w in str(err.value) for w in words), str(err.value)


# -- PAGE-1's page_size_unit crosses the sealed path the same way (spec 1.4) ---------------------

class _Paged:
    """A backend declaring pages in multiples of 16, as vllm-cpu-paged does."""
    page_size_unit = 16


def test_a_backends_page_size_unit_reaches_the_judging_process():
    raw = {**read_claims(load_backend("numpy-batched")),
           "page_size_unit": serving.page_size_unit_of(_Paged())}
    sealed = type("Sealed", (), {"page_size_unit": checked(raw).page_size_unit})()
    assert serving.page_size_unit_of(sealed) == 16
    assert checked(read_claims(load_backend("numpy-batched"))).page_size_unit == 1


def test_the_host_reads_page_size_unit_from_the_backend():
    backend = load_backend("numpy-batched")
    paged = type("PagedNumpy", (type(backend),), {"page_size_unit": 16})
    assert read_claims(paged("batched", name="paged-numpy"))["page_size_unit"] == 16


@pytest.mark.parametrize("unit", [0, -16, 1.5, True, "16"])
def test_a_page_size_unit_that_is_no_positive_int_is_a_claim_error(unit):
    raw = {**read_claims(load_backend("numpy-batched")), "page_size_unit": unit}
    with pytest.raises(ClaimError, match="page_size_unit"):
        checked(raw)
