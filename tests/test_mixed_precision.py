"""bfloat16 and float16: the op battery (values and gradients) on every backend against float64,
within a tolerance per dtype; conversions bit-exact against ml_dtypes and numpy; promotion as
PyTorch's; contractions and reductions accumulating in float32; modules and checkpoints.

Tolerances: each op on a low-precision value rounds once (unit roundoff u = 2^-9 for bfloat16,
2^-12 for float16), and a composite (softmax, layer norm, a conv's gradient) chains a few; the
battery allows |got - want| <= TOL * (|want| + max |want| of that output), TOL = 24 u."""
import ml_dtypes
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import dtypes
from tests.helpers import needs

# the backends that compute float16 and bfloat16 (the opencl backend's device kernels do not yet)
BACKENDS = ["numpy", "c", "llvm", "bang", "opencl"]

LOW = [mg.bfloat16, mg.float16]
TOL = {mg.bfloat16: 24 * 2.0 ** -9, mg.float16: 24 * 2.0 ** -12}
R = np.random.default_rng(5)


def f(*shape, low=-2.0, high=2.0):
    return R.uniform(low, high, shape)


def positive(*shape):
    return R.uniform(0.5, 2.0, shape)


# name -> (function of tensors, float inputs (take gradients), other inputs)
BATTERY = {
    "add_broadcast": (lambda a, b: a + b, [f(3, 5), f(5)], []),
    "sub_mul_div": (lambda a, b: (a - b) * a / (b.abs() + 0.5), [f(4, 6), f(4, 6)], []),
    "exp_log": (lambda a: a.exp() + (a.abs() + 0.25).log(), [f(4, 6)], []),
    "sqrt_pow": (lambda a: a.sqrt() + a ** 1.5 + a ** 2, [positive(4, 6)], []),
    "sin_cos_tanh": (lambda a: a.sin() * a.cos() + a.tanh(), [f(4, 6)], []),
    "sigmoid_relu_gelu": (lambda a: a.sigmoid() + a.relu() + F.gelu(a), [f(4, 6)], []),
    "where_clamp": (lambda a, b: mg.where(a > b, a, b).clamp(-1.0, 1.5), [f(4, 6), f(4, 6)], []),
    "sum_mean": (lambda a: a.sum(1) + a.mean(0).sum(), [f(6, 40)], []),
    "amax_var": (lambda a: a.amax(1) + a.var(1), [f(6, 16)], []),
    "cumsum": (lambda a: a.cumsum(1), [f(3, 9)], []),
    "matmul": (lambda a, b: a @ b, [f(5, 24), f(24, 7)], []),
    "batched_matmul": (lambda a, b: a @ b.transpose(-1, -2), [f(2, 5, 8), f(2, 6, 8)], []),
    "linear": (lambda x, w, b: F.linear(x, w, b), [f(6, 16), f(10, 16), f(10)], []),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), [f(2, 3, 7, 7), f(4, 3, 3, 3)], []),
    "conv2d_strided": (lambda x, w: F.conv2d(x, w, stride=2), [f(2, 3, 9, 9), f(4, 3, 3, 3)], []),
    "pools": (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), [f(2, 3, 6, 6)], []),
    "softmax": (lambda a: F.softmax(a, -1), [f(5, 12)], []),
    "log_softmax": (lambda a: F.log_softmax(a, -1), [f(5, 12)], []),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (12,), w, b), [f(5, 12), positive(12), f(12)], []),
    "cross_entropy": (lambda a, t: F.cross_entropy(a, t), [f(6, 5)], [R.integers(0, 5, 6)]),
    "embedding": (lambda w, i: F.embedding(i, w), [f(7, 4)], [R.integers(0, 7, (5, 3))]),
    "index_add": (lambda a, i: mg.zeros(4, 5, dtype=a.dtype).index_add(0, i, a), [f(6, 5)],
                  [np.array([0, 3, 3, 1, 0, 3])]),
    "views": (lambda a: a.transpose(0, 1).flip(0)[1:, ::2] * 2, [f(5, 6)], []),
    "pad_cat": (lambda a: mg.cat([F.pad(a, (1, 2)), a[:, :3]], dim=1), [f(3, 4)], []),
}


def _build(dtype, floats, others, fn):
    inputs = [mg.tensor(x, dtype=dtype, requires_grad=True) for x in floats]
    out = fn(*inputs, *[mg.tensor(o) for o in others])
    projection = mg.tensor(np.random.default_rng(0).uniform(-1, 1, out.shape), dtype=out.dtype)
    return [out] + mg.grad((out * projection).sum(), inputs)


def _battery(dtype, names):
    """The named cases' values and gradients, in one realisation (one compile of the battery)."""
    results = {}
    for name in names:
        fn, floats, others = BATTERY[name]
        rounded = [np.asarray(x, dtype.np).astype(np.float64) for x in floats]
        results[name] = (_build(dtype, rounded, others, fn), rounded, others)
    mg.sync(*[t for values, _, _ in results.values() for t in values])
    return results


# bang's kernels compile slowest (a quarter of this file's time per dtype): bfloat16 only there, and
# the cases that load, store, convert, scatter and contract
BATTERY_RUNS = [(b, d) for b in BACKENDS for d in LOW if (b, d) != ("bang", mg.float16)]
BANG_CASES = ["add_broadcast", "exp_log", "where_clamp", "sum_mean", "matmul", "conv2d_strided", "softmax",
              "embedding", "index_add", "views", "pad_cat"]


@pytest.mark.parametrize("backend, dtype", BATTERY_RUNS, ids=lambda value: getattr(value, "name", value))
def test_the_battery_matches_float64_within_the_dtypes_tolerance(backend, dtype):
    needs(backend)
    mg.set_backend(backend)
    results = _battery(dtype, BANG_CASES if backend == "bang" else list(BATTERY))
    mg.set_backend("numpy")
    failures = []
    for name, (values, rounded, others) in results.items():
        wants = _build(mg.float64, rounded, others, BATTERY[name][0])
        for k, (got, want) in enumerate(zip(values, wants)):
            if got.dtype != (dtype if want.dtype == mg.float64 else want.dtype):
                failures.append(f"{name}[{k}]: dtype {got.dtype.name}")
                continue
            g, w = got.numpy().astype(np.float64), want.numpy()
            bound = TOL[dtype] * (np.abs(w) + np.abs(w).max())
            if not np.all(np.abs(g - w) <= bound):
                worst = np.max(np.abs(g - w) / np.maximum(bound, 1e-300)) * TOL[dtype]
                failures.append(f"{name}[{k}]: off by {worst:.3g} of the scale")
    assert not failures, f"{backend} {dtype.name}: " + "; ".join(failures)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conversions_are_bit_exact_against_ml_dtypes_and_numpy(backend):
    """Ties, values just beside them, subnormals, overflow, inf and NaN; float64 -> float16 rounds
    once (numpy's) and float64 -> bfloat16 through float32 (ml_dtypes' and PyTorch's)."""
    needs(backend)
    mg.set_backend(backend)
    rng = np.random.default_rng(3)
    grid = {}
    for dtype in LOW:
        exact = rng.uniform(-300, 300, 400).astype(dtype.np).astype(np.float64)
        step = np.abs(np.spacing(exact.astype(dtype.np)).astype(np.float64))
        grid[dtype] = np.concatenate([exact + step / 2, exact - step / 2, exact + step / 2 * (1 + 2.0 ** -30),
                                      [1e-8, 1e-40, 3e-39, 65519.99, 65520.0, 3.4e38, 3.5e38, -1e300,
                                       np.inf, -np.inf, np.nan, 0.0, -0.0]])
    with np.errstate(all="ignore"):
        for dtype, values in grid.items():
            for source in (np.float64, np.float32):
                x = values.astype(source)
                got = mg.tensor(x).to(dtype).numpy()
                want = x.astype(dtype.np)
                assert np.array_equal(np.isnan(got), np.isnan(want))
                keep = ~np.isnan(want)
                np.testing.assert_array_equal(got.view(np.uint16)[keep], want.view(np.uint16)[keep])
                back = mg.tensor(want).to(mg.float32).numpy()
                np.testing.assert_array_equal(back, want.astype(np.float32))
            ints = np.array([-129, 0, 255, 257, 2 ** 24 + 3, -(2 ** 31) + 1], np.int64)
            np.testing.assert_array_equal(mg.tensor(ints).to(dtype).numpy().astype(np.float64),
                                          ints.astype(np.float32).astype(dtype.np).astype(np.float64))
            small = np.array([-3.75, -0.5, 0.0, 2.5, 100.0], dtype.np)
            np.testing.assert_array_equal(mg.tensor(small).to(mg.int32).numpy(), small.astype(np.int32))
    halves = np.array([1.5, -2.25, 65504.0, 6e-8], np.float16)
    np.testing.assert_array_equal(mg.tensor(halves).to(mg.bfloat16).numpy(), halves.astype(mg.bfloat16.np))


@pytest.mark.parametrize("a, b, want", [
    (mg.bfloat16, mg.float16, mg.float32),
    (mg.bfloat16, mg.float32, mg.float32),
    (mg.bfloat16, mg.float64, mg.float64),
    (mg.bfloat16, mg.int64, mg.bfloat16),
    (mg.bfloat16, mg.bool, mg.bfloat16),
    (mg.float16, mg.uint8, mg.float16),
])
def test_promotion_is_pytorchs(a, b, want):
    assert dtypes.promote(a, b) == want == dtypes.promote(b, a)
    assert (mg.ones(2, dtype=a) + mg.ones(2, dtype=b)).dtype == want
    torch = pytest.importorskip("torch")
    assert torch.promote_types(getattr(torch, a.name), getattr(torch, b.name)) == getattr(torch, want.name)


def test_scalars_and_zero_dim_tensors_do_not_widen_bfloat16():
    x = mg.ones(3, dtype=mg.bfloat16)
    assert (x * 2.5).dtype == mg.bfloat16 and (2 + x).dtype == mg.bfloat16
    assert (x + mg.tensor(1.0)).dtype == mg.bfloat16                     # 0-d float32
    assert (mg.ones(3, dtype=mg.float16) + mg.tensor(1.0, dtype=mg.bfloat16)).dtype == mg.float16


@pytest.mark.parametrize("backend", ["numpy", "c", "llvm"])
def test_reductions_and_contractions_accumulate_in_float32(backend):
    needs(backend)
    mg.set_backend(backend)
    ones = mg.ones(4096, dtype=mg.bfloat16)
    assert ones.sum().item() == 4096.0            # a bfloat16 accumulator stops at 256
    assert (ones.reshape(64, 64) @ ones.reshape(64, 64)).numpy().astype(np.float32).min() == 64.0
    a = R.uniform(-1, 1, (16, 300)).astype(mg.bfloat16.np)
    b = R.uniform(-1, 1, (300, 8)).astype(mg.bfloat16.np)
    got = (mg.tensor(a) @ mg.tensor(b)).numpy()
    # products exact in float32, summed there, rounded once: within an ulp of the float64 sum
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(mg.bfloat16.np)
    ulps = np.abs(got.view(np.int16).astype(np.int64) - want.view(np.int16).astype(np.int64))
    assert ulps.max() <= 1


def test_matmul_and_conv_match_torch_in_bfloat16():
    torch = pytest.importorskip("torch")
    a, b = R.uniform(-1, 1, (8, 64)), R.uniform(-1, 1, (64, 5))
    x, w = R.uniform(-1, 1, (2, 3, 8, 8)), R.uniform(-1, 1, (4, 3, 3, 3))
    ours = [(mg.tensor(a, dtype=mg.bfloat16) @ mg.tensor(b, dtype=mg.bfloat16)),
            F.conv2d(mg.tensor(x, dtype=mg.bfloat16), mg.tensor(w, dtype=mg.bfloat16), padding=1)]
    theirs = [torch.tensor(a).bfloat16() @ torch.tensor(b).bfloat16(),
              torch.nn.functional.conv2d(torch.tensor(x).bfloat16(), torch.tensor(w).bfloat16(), padding=1)]
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.numpy().astype(np.float32), want.float().numpy(), rtol=2 ** -7,
                                   atol=2 ** -7 * want.abs().max().item())


def test_bfloat16_tensors_are_ml_dtypes_arrays():
    x = mg.tensor([1.1, -2.0, 3.3], dtype=mg.bfloat16)
    assert x.numpy().dtype == ml_dtypes.bfloat16 and x.dtype == mg.bfloat16
    assert mg.tensor(np.array([0.5, 1.5], ml_dtypes.bfloat16)).dtype == mg.bfloat16
    assert x.tolist() == [1.1015625, -2.0, 3.296875] and x[0].item() == 1.1015625
    assert mg.ones(2).bfloat16().dtype == mg.bfloat16
    assert mg.as_tensor([1.0], dtype="bfloat16").dtype == mg.bfloat16
    assert "dtype=metagraph.bfloat16" in repr(x)


@pytest.mark.parametrize("dtype", LOW, ids=lambda d: d.name)
def test_modules_convert_and_train_in_low_precision(dtype):
    net = mg.nn.Sequential(mg.nn.Linear(4, 8), mg.nn.ReLU(), mg.nn.Linear(8, 2))
    converted = {"bfloat16": net.bfloat16, "float16": net.half}[dtype.name]()
    assert converted is net and all(p.dtype == dtype for p in net.parameters())
    x = mg.tensor(R.uniform(-1, 1, (16, 4)), dtype=dtype)
    target = mg.tensor(R.integers(0, 2, 16))
    optimizer = mg.optim.SGD(net.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert net[0].weight.grad.dtype == dtype and losses[-1] < losses[0]
    net.to(mg.float32)
    assert all(p.dtype == mg.float32 for p in net.parameters())
    with pytest.raises(mg.DTypeError, match="floating point"):
        net.to(mg.int32)


def test_bfloat16_checkpoints_round_trip_and_load_into_torch(tmp_path):
    net = mg.nn.Linear(3, 2).bfloat16()
    mg.save(net.state_dict(), tmp_path / "bf.pth")
    loaded = mg.load(tmp_path / "bf.pth")
    for key, value in net.state_dict().items():
        assert loaded[key].dtype == mg.bfloat16
        np.testing.assert_array_equal(loaded[key].numpy().view(np.uint16), value.numpy().view(np.uint16))
    torch = pytest.importorskip("torch")
    theirs = torch.load(tmp_path / "bf.pth", weights_only=True)
    assert theirs["weight"].dtype == torch.bfloat16
    np.testing.assert_array_equal(theirs["weight"].float().numpy(), net.weight.float().numpy())
    torch.save({"w": theirs["weight"] * 3}, tmp_path / "t.pth")
    np.testing.assert_array_equal(mg.load(tmp_path / "t.pth")["w"].float().numpy(),
                                  (theirs["weight"] * 3).float().numpy())


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_bfloat16_matmuls_run_on_the_avx512_bf16_kernel(backend):
    """Plain, transposed, batched, broadcast and vector operands: one bf16_ library step each,
    within an ulp of the oracle (both sum exact float32 products; the orders differ)."""
    from metagraph.codegen import bf16_gemm
    needs(backend)
    if not bf16_gemm.available():
        pytest.skip("this CPU has no AVX-512 BF16 (or no C compiler): bfloat16 matmuls are generated code")
    mg.set_backend(backend)
    rng = np.random.default_rng(9)

    def t(*shape):
        return mg.tensor(rng.uniform(-1, 1, shape), dtype=mg.bfloat16)
    cases = [lambda: t(33, 70) @ t(70, 45), lambda: t(20, 17) @ t(40, 17).T,
             lambda: t(3, 20, 24) @ t(3, 24, 18), lambda: t(2, 3, 16, 16) @ t(16, 20),
             lambda: t(128) @ t(128, 64), lambda: F.linear(t(2, 7, 24), t(32, 24), t(32)),
             lambda: t(4, 513) @ t(513, 16),
             lambda: t(6, 40) @ t(40), lambda: t(5, 6) @ t(6, 7)]       # too narrow, too small: generated
    for k, case in enumerate(cases):
        out = case()
        want = mg.backend._instance("numpy").realize([out.node])[0]
        with mg.profile() as report:
            got = out.numpy()
        assert any(s.name.startswith("bf16_") for s in report.kernels) == (k < 7), report.table()
        ulps = np.abs(got.view(np.int16).astype(np.int64) - want.view(np.int16).astype(np.int64))
        assert ulps.max() <= 1, (out.shape, ulps.max())


def test_rounding_division_and_special_values_match_torch_in_bfloat16():
    """Floor and trunc division, remainder, round and nan_to_num compute in float32 (as PyTorch's
    for bfloat16) and give its values, special ones included."""
    torch = pytest.importorskip("torch")
    values = [5.5, -3.25, 7.0, 0.1, -0.0, 99840.0, np.inf, -np.inf, np.nan]    # |a / b| < 2^22: exact
    ours, theirs = mg.tensor(values, dtype=mg.bfloat16), torch.tensor(values, dtype=torch.bfloat16)
    pairs = [(ours // 3, theirs // 3), (ours % 2.5, theirs % 2.5), (ours.round(), theirs.round()),
             (mg.div(ours, 3, rounding_mode="trunc"), torch.div(theirs, 3, rounding_mode="trunc")),
             (mg.nan_to_num(ours), torch.nan_to_num(theirs)), (ours.floor(), theirs.floor())]
    for got, want in pairs:
        assert got.dtype == mg.bfloat16
        np.testing.assert_array_equal(got.numpy().astype(np.float32), want.float().numpy())
