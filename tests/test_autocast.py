"""mg.autocast: the output dtypes of PyTorch's CPU autocast lists (compared with torch's own where
it is installed), nesting, enabled=False, the decorator, recorded composites keyed by the state,
gradients reaching float32 parameters, and values close to PyTorch's autocast."""
import importlib

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F

amp_autocast = importlib.import_module("metagraph.amp.autocast")     # mg.amp.autocast is the class

R = np.random.default_rng(2)


def _inputs(lib):
    """The same float32 (and int64 target) inputs as metagraph or torch tensors."""
    arrays = {"x": R.uniform(-1, 1, (4, 8)), "w": R.uniform(-1, 1, (6, 8)), "b": R.uniform(-1, 1, 6),
              "img": R.uniform(-1, 1, (2, 3, 8, 8)), "cw": R.uniform(-1, 1, (4, 3, 3, 3))}
    made = {k: lib.tensor(v.astype(np.float32)) for k, v in arrays.items()}
    made["t"] = lib.tensor(np.array([0, 3, 5, 1]))
    return made


def _ops(lib, functional):
    """op name -> function of the inputs; the names are PyTorch's (and the autocast table's)."""
    return {
        "matmul": lambda i: i["x"] @ i["w"].T,
        "linear": lambda i: functional.linear(i["x"], i["w"], i["b"]),
        "conv2d": lambda i: functional.conv2d(i["img"], i["cw"], padding=1),
        "conv1d": lambda i: functional.conv1d(i["img"][:, :, 0], i["cw"][:, :, 0]),
        "conv_transpose2d": lambda i: functional.conv_transpose2d(i["img"], i["cw"].transpose(0, 1)),
        "sdpa": lambda i: functional.scaled_dot_product_attention(i["x"][None], i["x"][None], i["x"][None]),
        "einsum": lambda i: lib.einsum("ij,kj->ik", i["x"], i["w"]),
        "prelu": lambda i: functional.prelu(i["x"], lib.tensor([0.25])),
        "softmax": lambda i: functional.softmax(i["x"], -1),
        "softmax_of_matmul": lambda i: functional.softmax(i["x"] @ i["w"].T, -1),
        "layer_norm_of_linear": lambda i: functional.layer_norm(functional.linear(i["x"], i["w"]), (6,)),
        "sum_of_matmul": lambda i: (i["x"] @ i["w"].T).sum(),
        "exp_log": lambda i: i["x"].exp() + (i["x"].abs() + 1).log(),
        "cross_entropy": lambda i: functional.cross_entropy(functional.linear(i["x"], i["w"]), i["t"]),
        "mse_loss": lambda i: functional.mse_loss(i["x"] @ i["w"].T, i["x"] @ i["w"].T),
        "l1_loss": lambda i: functional.l1_loss(i["x"] @ i["w"].T, i["x"] @ i["w"].T),
        "bce_with_logits": lambda i: functional.binary_cross_entropy_with_logits(
            i["x"] @ i["w"].T, (i["x"] @ i["w"].T).sigmoid()),
        "add_mixed": lambda i: (i["x"] @ i["w"].T) + i["b"],
        "max_pool_of_conv": lambda i: functional.max_pool2d(functional.conv2d(i["img"], i["cw"]), 2),
        "batch_norm_of_conv": lambda i: functional.batch_norm(
            functional.conv2d(i["img"], i["cw"]), lib.zeros(4), lib.ones(4), lib.ones(4), lib.zeros(4),
            training=True),
        "layer_norm_weighted": lambda i: functional.layer_norm(i["x"] @ i["w"].T, (6,), lib.ones(6),
                                                               lib.zeros(6)),
        "float64_matmul": lambda i: i["x"].double() @ i["w"].double().T,
    }


EXPECTED = {name: "bfloat16" for name in ["matmul", "linear", "conv2d", "conv1d", "conv_transpose2d", "sdpa",
                                          "einsum", "prelu", "softmax_of_matmul", "layer_norm_of_linear",
                                          "sum_of_matmul", "max_pool_of_conv", "batch_norm_of_conv",
                                          "layer_norm_weighted"]}
EXPECTED.update({name: "float32" for name in ["softmax", "exp_log", "cross_entropy", "mse_loss", "l1_loss",
                                              "bce_with_logits", "add_mixed"]})
EXPECTED["float64_matmul"] = "float64"


def test_output_dtypes_follow_pytorchs_cpu_lists():
    inputs = _inputs(mg)
    with mg.autocast(dtype=mg.bfloat16):
        got = {name: fn(inputs).dtype.name for name, fn in _ops(mg, F).items()}
    assert got == EXPECTED


def test_output_dtypes_equal_torchs_own_autocast():
    torch = pytest.importorskip("torch")
    inputs = _inputs(torch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = {name: str(fn(inputs).dtype).removeprefix("torch.")
                  for name, fn in _ops(torch, torch.nn.functional).items()}
    assert theirs == EXPECTED


def test_the_tables_name_pytorchs_lists():
    assert {"matmul", "linear", "conv2d", "scaled_dot_product_attention"} <= amp_autocast.LOWER_PRECISION
    assert {"cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits"} <= \
        amp_autocast.FLOAT32
    assert not amp_autocast.LOWER_PRECISION & amp_autocast.FLOAT32


def test_nesting_enabled_false_and_the_decorator():
    a, b = mg.randn(3, 4), mg.randn(4, 2)
    assert not mg.amp.is_autocast_enabled()
    with mg.autocast("cpu"):                           # PyTorch's CPU default: bfloat16
        assert (a @ b).dtype == mg.bfloat16
        with mg.autocast("cpu", enabled=False):
            assert (a @ b).dtype == mg.float32 and not mg.amp.is_autocast_enabled()
            with mg.autocast(device_type="cpu", dtype=mg.float16):
                assert (a @ b).dtype == mg.float16 and mg.amp.get_autocast_dtype() == mg.float16
            assert (a @ b).dtype == mg.float32
        assert (a @ b).dtype == mg.bfloat16
    assert (a @ b).dtype == mg.float32

    @mg.autocast(dtype=mg.bfloat16)
    def product(x, y):
        return x @ y
    assert product(a, b).dtype == mg.bfloat16 and (a @ b).dtype == mg.float32


def test_an_exception_inside_restores_the_state():
    with pytest.raises(ValueError):
        with mg.autocast():
            raise ValueError("inside")
    assert not mg.amp.is_autocast_enabled()


def test_bad_arguments_are_errors_naming_autocast():
    with pytest.raises(mg.ArgumentError, match="autocast: device_type must be 'cpu'"):
        mg.autocast("cuda")
    with pytest.raises(mg.DTypeError, match="autocast: dtype must be bfloat16 or float16, got float32"):
        mg.autocast(dtype=mg.float32)
    with pytest.raises(mg.ArgumentError, match="enabled must be a bool"):
        mg.autocast(enabled="yes")


def test_recorded_composites_do_not_carry_autocast_outside():
    """linear (a recorded composite) called outside, inside and outside again builds the right dtypes."""
    x, w, b = mg.randn(5, 3), mg.randn(2, 3), mg.randn(2)
    assert F.linear(x, w, b).dtype == mg.float32
    with mg.autocast():
        assert F.linear(x, w, b).dtype == mg.bfloat16
        assert mg.nn.functional.softmax(x @ w.T, -1).dtype == mg.bfloat16
    assert F.linear(x, w, b).dtype == mg.float32
    assert (x @ w.T).dtype == mg.float32


def test_gradients_reach_float32_parameters_as_float32():
    net = mg.nn.Sequential(mg.nn.Linear(8, 16), mg.nn.ReLU(), mg.nn.Linear(16, 3))
    x, target = mg.randn(10, 8), mg.tensor(R.integers(0, 3, 10))
    with mg.autocast():
        logits = net(x)
        loss = F.cross_entropy(logits, target)
    assert logits.dtype == mg.bfloat16 and loss.dtype == mg.float32
    loss.backward()
    for p in net.parameters():
        assert p.dtype == mg.float32 and p.grad.dtype == mg.float32 and np.isfinite(p.grad.numpy()).all()


def test_values_and_gradients_are_close_to_pytorchs_autocast():
    torch = pytest.importorskip("torch")
    x, w, b = R.uniform(-1, 1, (16, 32)), R.uniform(-1, 1, (8, 32)), R.uniform(-1, 1, 8)
    t = R.integers(0, 8, 16)
    ours = [mg.tensor(v.astype(np.float32), requires_grad=True) for v in (x, w, b)]
    theirs = [torch.tensor(v.astype(np.float32), requires_grad=True) for v in (x, w, b)]
    with mg.autocast(dtype=mg.bfloat16):
        out = F.linear(*ours)
        loss = F.cross_entropy(out, mg.tensor(t))
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        their_out = torch.nn.functional.linear(*theirs)
        their_loss = torch.nn.functional.cross_entropy(their_out, torch.tensor(t))
    their_loss.backward()
    scale = their_out.abs().max().item()
    np.testing.assert_allclose(out.numpy().astype(np.float32), their_out.float().detach().numpy(),
                               rtol=2 ** -7, atol=2 ** -7 * scale)
    np.testing.assert_allclose(loss.item(), their_loss.item(), rtol=1e-2)
    for mine, their in zip(ours, theirs):
        g = their.grad.numpy()
        np.testing.assert_allclose(mine.grad.numpy(), g, rtol=3e-2, atol=3e-2 * np.abs(g).max())


def test_the_amp_bench_rows_compute_the_same_products():
    """bench_amp's sides (ours and PyTorch's, autocast and float32) agree on a small matmul; the
    row's text names every figure (timings are not asserted)."""
    torch = pytest.importorskip("torch")
    from metagraph import bench_amp
    fns, unit, work = bench_amp.matmul(24)(torch)
    results = {name: np.asarray(fn(), np.float32) for name, fn in fns.items()}
    want = results["metagraph_f32"]
    for name, got in results.items():
        np.testing.assert_allclose(got, want, rtol=2 ** -6, atol=2 ** -6 * np.abs(want).max(), err_msg=name)
    row = {"id": "A1x", "workload": "matmul", "unit": unit, "bf16_over_f32": 1.0,
           **{name: float(work) for name in fns}}
    text = bench_amp.describe(row)
    assert "mg_bf16" in text and "pt_bf16" in text and "bf16/f32 1.00" in text
