"""A realisation gives a buffer back to the pool as soon as no later kernel of it reads it: its
peak is its live values, not every value it made (executor.dead_after). Values autograd would
keep go back too once nothing outside the realisation can reach them: a training step's
activations die as its backward pass consumes them."""
import gc
import weakref

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
        np.testing.assert_allclose(product.numpy(), x.numpy() @ x.numpy(), rtol=1e-5, atol=1e-6)
    assert prof.launches == 0


def _mlp_step(width, depth, batch, held=None):
    """One SGD step of a `depth`-layer MLP, realised at once; returns the model's parameters (and
    the activation at layer `held`, which the caller keeps)."""
    rng = np.random.default_rng(1)
    weights = [mg.tensor(rng.standard_normal((width, width)).astype(np.float32) / width ** 0.5,
                         requires_grad=True) for _ in range(depth)]
    h, kept = mg.tensor(rng.standard_normal((batch, width)).astype(np.float32)), None
    for k, w in enumerate(weights):
        h = (h @ w).relu()
        if k == held:
            kept = h
    optimizer = mg.optim.SGD(weights, lr=0.1)
    loss = (h * h).mean()
    loss.backward()
    with mg.profile() as prof:
        optimizer.step()
    return weights, kept, prof


def _numpy_mlp_step(width, depth, batch):
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal((width, width)).astype(np.float32) / width ** 0.5 for _ in range(depth)]
    hs = [rng.standard_normal((batch, width)).astype(np.float32)]
    for w in weights:
        hs.append(np.maximum(hs[-1] @ w, 0))
    g = 2 * hs[-1] / hs[-1].size
    new = [None] * depth
    for k in reversed(range(depth)):
        g = g * (hs[k + 1] > 0)
        new[k] = weights[k] - 0.1 * hs[k].T @ g
        g = g @ weights[k].T
    return new, hs


def test_a_training_step_frees_each_activation_once_backward_has_read_it():
    width, depth, batch = 64, 12, 512
    weights, _, prof = _mlp_step(width, depth, batch)
    want, _ = _numpy_mlp_step(width, depth, batch)
    for got, expected in zip(weights, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=2e-4, atol=2e-5)
    activation, parameter = batch * width * 4, width * width * 4
    assert prof.bytes_allocated >= 2 * depth * activation       # forward values and their gradients
    # Live at once, at most: what the backward pass reads of each layer (its input and the relu's
    # mask: two activations), one gradient and the weights' gradients; the forward values already
    # consumed are not held on top (they were: 2.8 activations a layer).
    assert prof.peak_bytes <= (2 * depth + 2) * activation + depth * parameter


def test_an_activation_the_user_holds_keeps_its_value():
    width, depth, batch = 32, 6, 64
    _, kept, _ = _mlp_step(width, depth, batch, held=2)
    _, hs = _numpy_mlp_step(width, depth, batch)
    with mg.profile() as prof:
        np.testing.assert_allclose(kept.numpy(), hs[3], rtol=1e-5, atol=1e-6)
    assert prof.launches == 0                  # held, not computed again


def test_a_graph_kept_for_a_second_backward_keeps_its_activations():
    rng = np.random.default_rng(2)
    x = mg.tensor(rng.standard_normal((16, 16)).astype(np.float32), requires_grad=True)
    loss = ((x @ x).relu() @ x).tanh().sum()
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    x.grad = None
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), first, rtol=1e-5, atol=1e-6)


def test_lowering_a_graph_keeps_none_of_its_nodes_alive():
    """Kernels just lowered (and their IR's reference cycles) must not hold the graph: its nodes'
    buffers would outlive their tensors until a cycle collection, and donation would find them
    still referred to."""
    rng = np.random.default_rng(3)
    enabled = gc.isenabled()
    gc.disable()                 # (a collection would hide what reference counting leaves alive)
    try:
        x = mg.tensor(rng.standard_normal((37, 53)).astype(np.float32))
        w = mg.tensor(rng.standard_normal((53, 29)).astype(np.float32))
        y = F.relu(x @ w) + x.sum()          # a register-tiled contraction and a reduction
        y.numpy()
        nodes = [weakref.ref(t.node) for t in (x, w, y)]
        del x, w, y
        assert [ref() for ref in nodes] == [None, None, None]
    finally:
        if enabled:
            gc.enable()


def test_dead_after_names_each_computed_value_once_at_its_last_reader():
    class Step:
        def __init__(self, *positions):
            self.positions = list(positions)
    steps = [Step(2, 0), Step(3, 2, 1), Step(4, 2, 3), Step(5, 4)]
    assert executor.dead_after(steps, outputs=[5, 3]) == [[], [], [2], [4]]
