"""The c backend holds float16 as its bits and converts them with integer helpers
(templates/c_helpers.j2). Their results must be numpy's bit for bit: every half widened, float32
and float64 samples narrowed (ties to even, subnormals, overflow to inf, NaN), and a float16
value read back as float32 inside a kernel (mg_round_f16)."""
import numpy as np
import pytest

import metagraph as mg
from tests.helpers import needs

ALL_HALVES = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
# numpy warns when a cast overflows to inf: here that is the case under test
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


@pytest.fixture(autouse=True)
def c_backend():
    needs("c")
    mg.set_backend("c")


def _assert_same_halves(got, want):
    """Bit for bit, except that a NaN only has to be a NaN (numpy's payload depends on its build)."""
    assert got.dtype == np.float16
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    mismatched = np.flatnonzero(got[~nan].view(np.uint16) != want[~nan].view(np.uint16))
    assert mismatched.size == 0, (f"{mismatched.size} values rounded differently from numpy, e.g. "
                                  f"{want[~nan][mismatched[:5]].astype(np.float64)} -> "
                                  f"{got[~nan][mismatched[:5]].astype(np.float64)}")


def _assert_same_floats(got, want):
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = {4: np.uint32, 8: np.uint64}[want.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


def _near_every_half(wide):
    """Values of the float type `wide` at, around and halfway between consecutive finite halves and
    the overflow threshold: each rounding boundary with both neighbours, of both signs."""
    uint = {np.float32: np.uint32, np.float64: np.uint64}[wide]
    finite = ALL_HALVES[:0x7c00].astype(wide)
    nexts = np.append(finite[1:], wide(65520.0))      # 65520: halfway to the next power, rounds to inf
    midpoints = ((finite.astype(np.float64) + nexts) / 2).astype(wide)
    centres = np.concatenate([finite, midpoints, nexts[-1:]]).view(uint).astype(np.int64)
    around = np.concatenate([centres + step for step in (-2, -1, 0, 1, 2)]).clip(0)
    magnitudes = around.astype(uint).view(wide)
    return np.concatenate([magnitudes, -magnitudes])


def _specials(wide):
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520, 1e30, -1e30,
                     2.0 ** -24, 2.0 ** -25, 2.0 ** -26, 1.5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -15,
                     np.finfo(wide).tiny, np.finfo(wide).max, np.finfo(wide).smallest_subnormal], wide)


def test_every_half_widens_exactly():
    halves = mg.tensor(ALL_HALVES)
    _assert_same_floats(halves.float().numpy(), ALL_HALVES.astype(np.float32))
    _assert_same_floats(halves.double().numpy(), ALL_HALVES.astype(np.float64))


def test_float32_narrows_to_nearest_even_as_numpy():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([random_bits, _near_every_half(np.float32), _specials(np.float32)])
    _assert_same_halves(mg.tensor(values).half().numpy(), values.astype(np.float16))


def test_float64_narrows_once_as_numpy():
    """Through float32 a float64 just above a tie would round to the tie, then to even."""
    rng = np.random.default_rng(1)
    random_bits = rng.integers(0, 1 << 63, 1 << 20, dtype=np.uint64) | \
        (rng.integers(0, 2, 1 << 20, dtype=np.uint64) << np.uint64(63))
    above_ties = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 2049 + 2.0 ** -30, 65504 + 16 - 2.0 ** -30])
    values = np.concatenate([random_bits.view(np.float64), _near_every_half(np.float64),
                             _specials(np.float64), above_ties, -above_ties])
    _assert_same_halves(mg.tensor(values).half().numpy(), values.astype(np.float16))
    assert (mg.tensor(above_ties).half().numpy() != above_ties.astype(np.float32).astype(np.float16)).all()


def test_float16_read_back_inside_a_kernel_rounds_as_numpy():
    """x.half().float() is one kernel: mg_round_f16 on float32's bits, never a float16 in memory."""
    rng = np.random.default_rng(2)
    random_bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([random_bits, _near_every_half(np.float32), _specials(np.float32)])
    with mg.profile() as report:
        got = mg.tensor(values).half().float().numpy()
    assert "mg_round_f16(" in report.kernels[-1].source
    _assert_same_floats(got, values.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("other", ["int8", "uint8", "int32", "int64", "bool"])
def test_float16_converts_to_and_from_integers_and_bool(other):
    """Truncation toward zero from float16 (finite values in range), C's and numpy's; to bool by
    value (-0 is false, NaN true); integers round to nearest even, beyond 65504 to inf."""
    info = np.iinfo(other) if other != "bool" else None
    finite = ALL_HALVES[np.isfinite(ALL_HALVES)]
    if info is not None:
        finite = finite[(finite > info.min - 1) & (finite < info.max + 1)]
    halves = finite if info is not None else ALL_HALVES
    np.testing.assert_array_equal(mg.tensor(halves).to(getattr(mg, other)).numpy(), halves.astype(other))
    small = info is not None and info.bits <= 16
    integers = (np.arange(info.min, info.max) if small else np.arange(-70000, 70000, 7)).astype(other)
    _assert_same_halves(mg.tensor(integers).half().numpy(), integers.astype(np.float16))


def test_float16_constants_are_their_bits():
    """A constant rounds to float16 as numpy rounds it (0.1 is not exact): stored as its bits, and
    in arithmetic as the oracle computes it."""
    with mg.profile() as report:
        filled = mg.full((3, 5), 0.1, dtype=mg.float16).numpy()
    assert "((uint16_t)0x2e66)" in report.kernels[-1].source
    _assert_same_halves(filled, np.full((3, 5), 0.1, np.float16))
    finite = ALL_HALVES[np.isfinite(ALL_HALVES)]
    got = (mg.tensor(finite) * 0.1 + 1.0 / 3).numpy()
    mg.set_backend("numpy")
    _assert_same_halves(got, (mg.tensor(finite) * 0.1 + 1.0 / 3).numpy())
