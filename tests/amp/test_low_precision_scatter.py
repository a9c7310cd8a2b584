"""A float16 or bfloat16 scatter-add sums in float32 and rounds once, as a reduction does, as the
numpy oracle computes it and as PyTorch's scatter_add and embedding gradients give it.

Compiled backends used to add each value into the low-precision output and round after every
addition: 2,000 values below 1 summed into a bfloat16 element stopped at 256, where the spacing of
bfloat16 is 2. `ops/table.py`'s `apply` builds such a scatter as a float32 scatter of the widened
values and one cast."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from tests.helpers import needs

BACKENDS = ["numpy", "c", "llvm", "bang"]
DTYPES = [mg.bfloat16, mg.float16]


def _rounded_once(values, dtype):
    """The exact sum of each row of `values` (low-precision values as float64) rounded to dtype."""
    return values.sum(axis=-1).astype(np.float32).astype(dtype.np).astype(np.float64)


def _within_an_ulp(got, want, dtype):
    spacing = np.abs(np.spacing(want.astype(dtype.np)).astype(np.float64))
    return np.all(np.abs(got - want) <= spacing), (got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_add_of_many_values_rounds_once(backend, dtype):
    needs(backend)
    mg.set_backend(backend)
    rng = np.random.default_rng(0)
    source = rng.uniform(0, 1, (2000, 4)).astype(dtype.np)
    index = rng.integers(0, 3, (2000, 4))
    got = mg.zeros((3, 4), dtype=dtype).scatter_add(0, mg.tensor(index), mg.tensor(source)).numpy()
    values = source.astype(np.float64)
    want = np.stack([_rounded_once(np.where(index == row, values, 0).T, dtype) for row in range(3)])
    ok, detail = _within_an_ulp(got.astype(np.float64), want, dtype)
    assert ok, detail


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_gradient_of_repeated_tokens_rounds_once(backend, dtype):
    """An embedding table's gradient: each row sums the output gradients of every use of its token."""
    needs(backend)
    mg.set_backend(backend)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 5, 3000)
    weights = rng.uniform(0, 1, (3000, 6)).astype(dtype.np)
    table = mg.tensor(rng.standard_normal((8, 6)), dtype=dtype, requires_grad=True)
    (F.embedding(mg.tensor(tokens), table) * mg.tensor(weights)).sum().backward()
    values = weights.astype(np.float64)
    want = np.stack([_rounded_once(values[tokens == row].T, dtype) for row in range(8)])
    ok, detail = _within_an_ulp(table.grad.numpy().astype(np.float64), want, dtype)
    assert ok, detail


def test_torch_rounds_a_bfloat16_scatter_add_once():
    """The behaviour asked for is PyTorch's (CPU, bfloat16): the oracle's values."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    source = rng.uniform(0, 1, (2000, 4)).astype(mg.bfloat16.np)
    index = rng.integers(0, 3, (2000, 4))
    theirs = torch.zeros(3, 4, dtype=torch.bfloat16).scatter_add(
        0, torch.from_numpy(index), torch.from_numpy(source.astype(np.float32)).bfloat16())
    mg.set_backend("numpy")
    ours = mg.zeros((3, 4), dtype=mg.bfloat16).scatter_add(0, mg.tensor(index), mg.tensor(source)).numpy()
    np.testing.assert_array_equal(ours.astype(np.float32), theirs.float().numpy())


@pytest.mark.parametrize("dtype", DTYPES + [mg.float32])
def test_a_padded_conv_input_gradient_scatters_into_the_input_not_its_padded_copy(dtype):
    """The float32 sum a low-precision input gradient is built as (a window gradient's reduction,
    ops/window_gradient.py) still sums into the unpadded input (it looks through the cast), as in
    float32."""
    rng = np.random.default_rng(3)
    data, weights = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((3, 2, 3, 3))
    x = mg.tensor(data.astype(dtype.np), requires_grad=True)
    w = mg.tensor(weights.astype(dtype.np))
    (grad,) = mg.grad(F.conv2d(x, w, padding=1).sum(), [x])
    shapes, stack, seen = set(), [grad.node], set()
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen.add(node.id)
            shapes |= {node.shape} if node.op in ("reduce", "reindex_reduce") else set()
            stack.extend(node.inputs)
    assert (1, 2, 4, 4) in shapes and (1, 2, 6, 6) not in shapes, shapes
    wide = mg.tensor(data.astype(dtype.np).astype(np.float32), requires_grad=True)
    want = mg.grad(F.conv2d(wide, w.float(), padding=1).sum(), [wide])[0].numpy()
    np.testing.assert_allclose(grad.float().numpy(), want, rtol=1e-2, atol=1e-2)
