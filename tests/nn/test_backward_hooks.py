"""Gradient hooks against PyTorch: Tensor.register_hook / retain_grad and a module's full backward
hooks and pre-hooks (what they see, in which order, and what replacing a gradient does)."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn

torch = pytest.importorskip("torch")

FRAMEWORKS = [(mg, nn), (torch, torch.nn)]
RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 4)).astype(np.float32)


def _numpy(value):
    return None if value is None else value.detach().numpy().copy()


def _same(ours, theirs):
    """Logs of nested tuples/lists of arrays, strings and None are equal (arrays to 1e-5)."""
    if isinstance(ours, (tuple, list)):
        assert isinstance(theirs, (tuple, list)) and len(ours) == len(theirs), (ours, theirs)
        for a, b in zip(ours, theirs):
            _same(a, b)
    elif isinstance(ours, np.ndarray):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    else:
        assert ours == theirs


def _copied(lib, layers, seed=0):
    """Give every parameter the same values in both frameworks (ours are set from a seed)."""
    rng = np.random.default_rng(seed)
    with (torch.no_grad() if lib is torch else mg.no_grad()):
        for parameter in layers.parameters():
            parameter.copy_(lib.tensor(rng.standard_normal(tuple(parameter.shape)).astype(np.float32)))
    return layers


def _tensor_hooks(lib, nn_):
    log = []
    x = lib.tensor(X, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.register_hook(lambda g: log.append(("y-1", _numpy(g))))
    y.register_hook(lambda g: g * 10)
    y.register_hook(lambda g: log.append(("y-3", _numpy(g))))
    handle = x.register_hook(lambda g: log.append("removed"))
    handle.remove()
    x.register_hook(lambda g: g + 1)
    z = y * y
    z.register_hook(lambda g: log.append(("z", _numpy(g))))
    ((z * y).sum() + x.sum()).backward()
    return log, _numpy(x.grad), _numpy(y.grad), y.retains_grad, x.retains_grad


def test_tensor_hooks_see_and_replace_gradients_as_in_torch():
    _same(*(_tensor_hooks(lib, nn_) for lib, nn_ in FRAMEWORKS))


def test_tensor_hooks_run_in_grad_too():
    results = []
    for lib, _ in FRAMEWORKS:
        x = lib.tensor(X, requires_grad=True)
        y = x.exp()
        y.register_hook(lambda g: g * 3)
        grad = (mg.grad if lib is mg else lambda out, inp: torch.autograd.grad(out, inp)[0])(
            (y * x).sum(), x)
        results.append(_numpy(grad))
    _same(*results)


def test_a_tensor_hook_must_keep_the_shape():
    x = mg.tensor(X, requires_grad=True)
    x.register_hook(lambda g: g.sum())
    with pytest.raises(mg.ShapeError,
                       match=r"gradient hook of a tensor of shape \(5, 4\) returned shape \(\)"):
        (x * x).sum().backward()
    with pytest.raises(mg.MetagraphError, match="does not require grad"):
        mg.tensor(X).register_hook(lambda g: g)


def _module_hooks(lib, nn_, input_requires_grad):
    """A Sequential with hooks on it and on every child; a residual use of the input outside it."""
    net = _copied(lib, nn_.Sequential(nn_.Linear(4, 3), nn_.Tanh(), nn_.Linear(3, 2)))
    log = []

    def pre(tag):
        def hook(module, grad_output):
            log.append((tag, "pre", [_numpy(g) for g in grad_output]))
            return tuple(g * 2 for g in grad_output) if tag == "1" else None
        return hook

    def full(tag):
        def hook(module, grad_input, grad_output):
            log.append((tag, "full", [_numpy(g) for g in grad_input], [_numpy(g) for g in grad_output]))
            return (grad_input[0] + 1,) if tag == "2" else None
        return hook

    for tag, module in [("net", net), *((str(k), child) for k, child in enumerate(net))]:
        module.register_full_backward_pre_hook(pre(tag))
        module.register_full_backward_hook(full(tag))
    x = lib.tensor(X, requires_grad=input_requires_grad)
    out = net(x)
    loss = (out * out).sum() + (x * 3).sum() if input_requires_grad else (out * out).sum()
    loss.backward()
    return log, _numpy(x.grad), [_numpy(p.grad) for p in net.parameters()]


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_module_backward_hooks_match_torch(input_requires_grad):
    _same(*(_module_hooks(lib, nn_, input_requires_grad) for lib, nn_ in FRAMEWORKS))


class _TwoWay:
    """A module of two inputs (one a number, one a tensor without grad) and two outputs."""

    @staticmethod
    def make(nn_):
        class TwoWay(nn_.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn_.Linear(4, 4)

            def forward(self, a, scale, b, c):
                return self.linear(a) * scale + b, c.exp() * a

        return TwoWay()


def _two_way(lib, nn_, use_second):
    module = _copied(lib, _TwoWay.make(nn_))
    log = []
    module.register_full_backward_hook(
        lambda m, gi, go: log.append(([_numpy(g) for g in gi], [_numpy(g) for g in go])))
    a, b, c = (lib.tensor(X, requires_grad=flag) for flag in (True, False, True))
    first, second = module(a, 0.5, b, c)
    loss = first.sum() + (second.sum() if use_second else 0)
    loss.backward()
    # c's gradient is None here where second is unused, and zeros in PyTorch (its hook function
    # materialises one for every input): the same value.
    return log, _numpy(a.grad), np.zeros_like(X) if c.grad is None else _numpy(c.grad)


@pytest.mark.parametrize("use_second", [True, False])
def test_backward_hooks_of_several_inputs_and_outputs_match_torch(use_second):
    _same(*(_two_way(lib, nn_, use_second) for lib, nn_ in FRAMEWORKS))


def test_a_removed_or_no_grad_backward_hook_is_not_called():
    layer, calls = nn.Linear(4, 2), []
    handle = layer.register_full_backward_hook(lambda *args: calls.append(args))
    with mg.no_grad():
        layer(mg.tensor(X))
    layer(mg.tensor(X, requires_grad=True)).sum().backward()
    assert len(calls) == 1
    handle.remove()
    layer(mg.tensor(X, requires_grad=True)).sum().backward()
    assert len(calls) == 1


def test_a_backward_hook_must_return_one_gradient_per_input_of_its_shape():
    layer = nn.Linear(4, 2)
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: (grad_input[0], grad_input[0]))
    with pytest.raises(mg.MetagraphError, match="Linear: a backward hook returned 2 values for grad_input, "
                                                "expected 1"):
        layer(mg.tensor(X, requires_grad=True)).sum().backward()
    layer = nn.Linear(4, 2)
    layer.register_full_backward_pre_hook(lambda module, grad_output: (grad_output[0].sum(),))
    with pytest.raises(mg.ShapeError, match=r"grad_output\[0\] of shape \(\), expected .* shape \(5, 2\)"):
        layer(mg.tensor(X, requires_grad=True)).sum().backward()
