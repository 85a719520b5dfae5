"""Integer units and resource vectors: floats and negative amounts are bugs and raise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core import ResourceVector, TaskShape
from gpupool.core.units import format_milli, parse_milli, trunc_div


@pytest.mark.parametrize(("text", "want"), [("0.5", 500), ("2", 2000), ("0.125", 125), ("1.0", 1000)])
def test_parse_milli(text, want):
    assert parse_milli(text) == want


@pytest.mark.parametrize("text", ["-1", "abc", "0.0001", "nan"])
def test_parse_milli_rejects_with_field_name(text):
    with pytest.raises(ValueError, match="gpus"):
        parse_milli(text, field="gpus")


@given(st.integers(0, 10**9))
def test_format_then_parse_round_trips(milli):
    assert parse_milli(format_milli(milli)) == milli


def test_resource_vector_rejects_floats_and_negative_results():
    with pytest.raises(TypeError):
        ResourceVector(gpu_milli=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        ResourceVector(gpu_milli=1) - ResourceVector(gpu_milli=2)


@given(st.dictionaries(st.sampled_from("abc"), st.integers(0, 1000)),
       st.dictionaries(st.sampled_from("abc"), st.integers(0, 1000)))
def test_resource_vector_add_then_sub_is_identity(a, b):
    assert (ResourceVector(a) + ResourceVector(b)) - ResourceVector(b) == ResourceVector(a)


@given(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 1000)),
       st.dictionaries(st.sampled_from("abcd"), st.integers(0, 1000)))
def test_resource_vector_sums_keep_name_order_and_changes_name_what_grew(a, b):
    before = ResourceVector(a)
    after = before + ResourceVector(b)
    assert list(after) == sorted(after) and dict(after.items()) == {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}
    assert after.changes_from(before) == sorted((k, v) for k, v in b.items() if v)


def test_trunc_div_truncates_toward_zero():
    assert trunc_div(-7, 2) == -3 and trunc_div(7, 2) == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"gpu_count": 2, "gpu_milli": 500}, "gpu_milli"), ({"gpu_milli": 500}, "gpu_milli"),
     ({"cpu_milli": -1}, "cpu_milli"), ({"gpu_count": 1, "gpu_milli": 1500}, "gpu_milli")],
    ids=["fraction of several GPUs", "fraction without a GPU", "negative cpu", "more than one GPU per GPU"],
)
def test_task_shape_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TaskShape(**kwargs)
