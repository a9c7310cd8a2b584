"""Gradient clipping against PyTorch on the same gradients; the clip stays lazy."""
import math

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn, optim
from metagraph.nn.utils import clip_grad_norm_, clip_grad_value_, get_total_norm

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,), (2, 2, 2)]


def _pairs(dtype=np.float64, seed=0, scale=1.0):
    """The same parameters and gradients on both sides (the last parameter has no gradient)."""
    rng = np.random.default_rng(seed)
    ours, theirs = [], []
    for index, shape in enumerate(SHAPES + [(2,)]):
        value = rng.standard_normal(shape).astype(dtype)
        ours.append(nn.Parameter(mg.tensor(value)))
        theirs.append(torch.nn.Parameter(torch.tensor(value)))
        if index < len(SHAPES):
            grad = (scale * rng.standard_normal(shape)).astype(dtype)
            ours[-1].grad, theirs[-1].grad = mg.tensor(grad), torch.tensor(grad)
    return ours, theirs


def _assert_grads_equal(ours, theirs, rtol):
    for p, q in zip(ours, theirs):
        if q.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=rtol, atol=0)


@pytest.mark.parametrize("norm_type", [2.0, 1, 3.5, math.inf, "inf", -math.inf, 0])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])           # clipped, and left alone (the scale is 1)
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, theirs = _pairs()
    total = clip_grad_norm_(ours, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert total.shape == () and total.dtype == mg.float64
    np.testing.assert_allclose(total.numpy(), expected.numpy(), rtol=1e-12)
    _assert_grads_equal(ours, theirs, rtol=1e-12)


def test_clip_grad_norm_float32():
    ours, theirs = _pairs(np.float32)
    total = clip_grad_norm_(ours, 0.7)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.7)
    assert total.dtype == mg.float32
    np.testing.assert_allclose(total.numpy(), expected.numpy(), rtol=1e-6)
    _assert_grads_equal(ours, theirs, rtol=1e-6)


def test_clip_is_lazy_and_in_place():
    ours, _ = _pairs()
    grad = ours[0].grad
    with mg.profile() as prof:
        total = clip_grad_norm_(ours, 0.5)
        clip_grad_value_(ours, 0.1)
    assert prof.launches == 0 and total.node.buffer is None      # nothing computed before a sync
    assert ours[0].grad is grad and grad.node.buffer is None        # the same tensor, updated in place


def test_single_tensor_empty_list_and_generator():
    ours, theirs = _pairs()
    np.testing.assert_allclose(clip_grad_norm_(ours[0], 0.1).numpy(),
                               torch.nn.utils.clip_grad_norm_(theirs[0], 0.1).numpy(), rtol=1e-12)
    _assert_grads_equal(ours, theirs, rtol=1e-12)
    empty = clip_grad_norm_([], 1.0)
    assert empty.shape == () and empty.dtype == mg.float32 and empty.item() == 0.0
    with pytest.warns(UserWarning, match="empty generator"):
        clip_grad_norm_((p for p in []), 1.0)


def test_nonfinite_norm():
    ours, theirs = _pairs()
    ours[1].grad = mg.tensor([1.0, math.inf, 0.0, 0.0, 0.0], dtype=mg.float64)
    theirs[1].grad = torch.tensor([1.0, math.inf, 0.0, 0.0, 0.0], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="clip_grad_norm_: the total norm of order 2.0 .* non-finite"):
        clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    total = clip_grad_norm_(ours, 1.0)                      # scaled by 1 / inf anyway, as PyTorch
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isinf(total.item()) and math.isinf(expected.item())
    for p, q in zip(ours[:3], theirs[:3]):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


def test_get_total_norm_matches_torch():
    ours, theirs = _pairs(seed=3)
    grads, reference = [p.grad for p in ours[:3]], [q.grad for q in theirs[:3]]
    for norm_type in (2.0, math.inf, 1.5):
        np.testing.assert_allclose(get_total_norm(grads, norm_type).numpy(),
                                   torch.nn.utils.get_total_norm(reference, norm_type).numpy(), rtol=1e-12)


@pytest.mark.parametrize("clip_value", [0.3, 2.0])
def test_clip_grad_value_matches_torch(clip_value):
    ours, theirs = _pairs(scale=2.0)
    assert clip_grad_value_(ours, clip_value) is None
    torch.nn.utils.clip_grad_value_(theirs, clip_value)
    _assert_grads_equal(ours, theirs, rtol=0)


def test_training_steps_with_clipping_match_torch():
    """backward, clip, step: the parameters after a few steps, and nothing recompiled once warm."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((16, 6)), rng.integers(0, 3, 16)
    ours, theirs = nn.Linear(6, 3).double(), torch.nn.Linear(6, 3).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    opt_ours = optim.SGD(ours.parameters(), lr=0.5, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.5, momentum=0.9)

    def step():
        opt_ours.zero_grad()
        nn.functional.cross_entropy(ours(mg.tensor(x)), mg.tensor(y)).backward()
        norm = mg.nn.utils.clip_grad_norm_(ours.parameters(), 0.1)
        opt_ours.step()
        opt_theirs.zero_grad()
        torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y)).backward()
        expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.1)
        opt_theirs.step()
        np.testing.assert_allclose(norm.numpy(), expected.numpy(), rtol=1e-10)

    step()
    step()                          # the first step makes the momentum buffers: its graph differs
    with mg.profile() as prof:
        for _ in range(2):
            step()
    assert prof.compiles == 0
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_bad_arguments():
    ours, _ = _pairs()
    with pytest.raises(ValueError, match="clip_grad_norm_: norm_type must be a number or 'inf', got 'fro'"):
        clip_grad_norm_(ours, 1.0, norm_type="fro")
    with pytest.raises(TypeError, match="clip_grad_norm_: expected a tensor or an iterable of tensors"):
        clip_grad_norm_(3, 1.0)
    with pytest.raises(TypeError, match="clip_grad_value_: expected tensors, got an element of type list"):
        clip_grad_value_([[1.0]], 1.0)
