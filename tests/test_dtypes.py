"""Type promotion follows PyTorch: categories, the uint8/int8 lattice, weak scalars, 0-d tensors."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import dtypes


@pytest.mark.parametrize("a, b, want", [
    (mg.bool, mg.uint8, mg.uint8),
    (mg.uint8, mg.int8, mg.int16),
    (mg.uint8, mg.int16, mg.int16),
    (mg.uint8, mg.int32, mg.int32),
    (mg.int8, mg.int64, mg.int64),
    (mg.int32, mg.float16, mg.float16),
    (mg.int64, mg.float32, mg.float32),
    (mg.float16, mg.float32, mg.float32),
    (mg.float32, mg.float64, mg.float64),
    (mg.bool, mg.float16, mg.float16),
])
def test_tensor_tensor_promotion(a, b, want):
    assert dtypes.promote(a, b) == want == dtypes.promote(b, a)
    result = mg.ones(2, dtype=a) + mg.ones(2, dtype=b)
    assert result.dtype == want


@pytest.mark.parametrize("dtype, scalar, want", [
    (mg.uint8, 1000, mg.uint8),          # int scalars do not widen integer tensors
    (mg.int32, 2.5, mg.float32),         # float scalars make integers the default float
    (mg.float16, 2.5, mg.float16),       # and do not widen float tensors
    (mg.float64, 1, mg.float64),
    (mg.bool, 1, mg.int64),              # bool tensors take the scalar's category
    (mg.bool, 1.5, mg.float32),
    (mg.bool, True, mg.bool),
    (mg.int8, True, mg.int8),
])
def test_scalars_are_weak(dtype, scalar, want):
    assert (mg.ones(3, dtype=dtype) * scalar).dtype == want
    assert (scalar * mg.ones(3, dtype=dtype)).dtype == want


def test_a_weak_scalar_of_the_tensors_kind_converts_as_an_element_would():
    # ops/math.operands takes these without a promotion pass: the values must be the same
    assert (mg.tensor(np.array([1, 200], np.uint8)) + 100).numpy().tolist() == [101, 44]
    assert (mg.tensor(np.array([1, 2], np.int8)) * 300).numpy().tolist() == [44, 88]
    assert (2.5 - mg.tensor(np.array([1, 2], np.int32))).numpy().tolist() == [1.5, 0.5]
    half = (mg.tensor(np.array([1.0], np.float16)) + 0.1).numpy()
    assert half.dtype == np.float16 and half[0] == np.float16(1) + np.float16(0.1)


def test_zero_dim_tensors_rank_below_shaped_ones():
    shaped = mg.ones(3, dtype=mg.int32)
    assert (shaped + mg.tensor(5)).dtype == mg.int32                 # 0-d int64 does not widen
    assert (shaped + mg.tensor(5.0)).dtype == mg.float32             # but a higher category wins
    assert (mg.ones(3) + mg.tensor(1.0, dtype=mg.float64)).dtype == mg.float32
    assert (mg.tensor(1, dtype=mg.int8) + mg.tensor(1, dtype=mg.int16)).dtype == mg.int16


def test_division_and_creation_defaults():
    assert (mg.tensor([1, 2]) / mg.tensor([2, 2])).dtype == mg.float32
    assert mg.tensor([1, 2]).dtype == mg.int64
    assert mg.tensor([1.0, 2]).dtype == mg.float32
    assert mg.tensor([True]).dtype == mg.bool
    assert mg.tensor(np.array([1.0])).dtype == mg.float64       # numpy dtypes are kept
    assert mg.arange(3).dtype == mg.int64 and mg.arange(0, 1, 0.5).dtype == mg.float32
    assert mg.zeros(2).dtype == mg.float32 and mg.full((2,), 3).dtype == mg.int64


def test_wide_types_are_computed_wide():
    big = 2 ** 40 + 1
    assert (mg.tensor([big]) * 3).tolist() == [3 * big]
    assert (mg.tensor([big]) // 7).tolist() == [big // 7]
    x = mg.tensor([1.0 + 1e-12], dtype=mg.float64)
    assert (x - 1.0).item() == pytest.approx(1e-12, rel=1e-3)


def test_in_place_keeps_the_dtype_and_refuses_narrowing_to_int():
    x = mg.ones(2, dtype=mg.float16)
    x += mg.ones(2, dtype=mg.float64)
    assert x.dtype == mg.float16
    i = mg.tensor([1, 2])
    with pytest.raises(TypeError, match="can't be cast"):
        i += 1.5
    i += 2
    assert i.tolist() == [3, 4]


@pytest.mark.parametrize("spelling", ["float32", "float", np.float32, np.dtype("float32"), mg.float32])
def test_dtype_spellings(spelling):
    assert mg.zeros(1, dtype=spelling).dtype == mg.float32


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="unsupported dtype"):
        mg.zeros(1, dtype="complex64")


def test_conversions():
    x = mg.tensor([1.7, -2.2])
    assert x.long().tolist() == [1, -2] and x.int().dtype == mg.int32
    assert x.half().dtype == mg.float16 and x.double().dtype == mg.float64
    assert x.bool().tolist() == [True, True] and x.to(mg.int8).dtype == mg.int8
    assert x.to("cpu") is x


def test_explicit_dtype_does_not_round_through_the_default():
    assert mg.tensor(0.1, dtype=mg.float64).item() == 0.1
    assert mg.tensor([0.1], dtype=mg.float64).tolist() == [0.1]
