"""A realisation gives a buffer back to the pool as soon as no later kernel of it reads it: its
peak is its live values, not every value it made (executor.dead_after)."""
import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.runtime import executor


def _chain(x, n):
    for _ in range(n):
        x = F.softmax(x @ x, dim=-1)          # a matmul and a softmax: materialised values
    return x


def test_a_chain_holds_only_its_live_values():
    rng = np.random.default_rng(0)
    start = rng.standard_normal((128, 128)).astype(np.float32)
    with mg.profile() as prof:
        got = _chain(mg.tensor(start), 12).numpy()
    want = start
    for _ in range(12):
        product = want @ want
        e = np.exp(product - product.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    one = 128 * 128 * 4
    assert prof.bytes_allocated >= 20 * one
    assert prof.peak_bytes <= 4 * one + 4096


def test_values_autograd_keeps_survive_the_realisation():
    x = mg.tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), requires_grad=True)
    product = x @ x                           # materialised, requires grad: kept
    loss = (product.relu() @ product).sum()
    loss.backward()
    mg.sync(x.grad)
    with mg.profile() as prof:
        np.testing.assert_allclose(product.numpy(), x.numpy() @ x.numpy(), rtol=1e-5)
    assert prof.launches == 0


def test_dead_after_names_each_computed_value_once_at_its_last_reader():
    class Step:
        def __init__(self, *positions):
            self.positions = list(positions)
    steps = [Step(2, 0), Step(3, 2, 1), Step(4, 2, 3), Step(5, 4)]
    assert executor.dead_after(steps, outputs=[5, 3]) == [[], [], [2], [4]]
