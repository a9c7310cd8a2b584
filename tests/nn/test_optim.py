"""Optimizers and schedules against hand-computed values (and PyTorch when installed)."""

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn, optim


def quadratic_steps(optimizer_class, steps=3, **kwargs):
    w = nn.Parameter(mg.tensor([1.0, -2.0], dtype=mg.float64))
    opt = optimizer_class([w], **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        (w * w).sum().backward()  # gradient 2w
        opt.step()
    return w.numpy(), opt


def test_sgd_momentum_by_hand():
    got, _ = quadratic_steps(optim.SGD, lr=0.1, momentum=0.9)
    w, buf = np.array([1.0, -2.0]), None
    for _ in range(3):
        g = 2 * w
        buf = g if buf is None else 0.9 * buf + g
        w = w - 0.1 * buf
    np.testing.assert_allclose(got, w, rtol=1e-12)


def test_adam_by_hand():
    got, opt = quadratic_steps(optim.Adam, lr=0.1)
    w, m, v = np.array([1.0, -2.0]), 0, 0
    for t in range(1, 4):
        g = 2 * w
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w = w - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(got, w, rtol=1e-12)
    state = opt.state_dict()
    assert state["state"][0]["step"] == 3 and state["param_groups"][0]["lr"] == 0.1


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
        ("Adam", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
        ("AdamW", dict(lr=0.01)),
        ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)),
    ],
)
def test_against_pytorch(name, kwargs):
    torch = pytest.importorskip("torch")
    w0 = np.random.default_rng(0).standard_normal((3, 4))
    ours, theirs = nn.Parameter(mg.tensor(w0)), torch.nn.Parameter(torch.tensor(w0))
    opt_ours, opt_theirs = (
        getattr(optim, name)([ours], **kwargs),
        getattr(torch.optim, name)([theirs], **kwargs),
    )
    for _ in range(4):
        opt_ours.zero_grad()
        (ours**3).sum().backward()
        opt_ours.step()
        opt_theirs.zero_grad()
        (theirs**3).sum().backward()
        opt_theirs.step()
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_step_with_loss_is_jittor_style():
    w = nn.Parameter(mg.tensor([3.0], dtype=mg.float64))
    opt = optim.SGD([w], lr=0.25)
    opt.step((w * w).sum())
    assert w.item() == 1.5


def test_changing_learning_rate_recompiles_nothing():
    w = nn.Parameter(mg.tensor([1.0, 2.0]))
    opt = optim.SGD([w], lr=0.1)
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step((w * w).sum())
    scheduler.step()
    with mg.profile() as prof:
        for _ in range(3):
            opt.step((w * w).sum())
            scheduler.step()
    assert prof.compiles == 0


@pytest.mark.parametrize("make, key", [(lambda w: optim.SGD([w], lr=0.1, momentum=0.9), "momentum"),
                                       (lambda w: optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True),
                                        "momentum"),
                                       (lambda w: optim.RMSprop([w], lr=0.1, momentum=0.9), "momentum"),
                                       (lambda w: optim.Adam([w], lr=0.1), "betas")])
def test_changing_momentum_or_betas_recompiles_nothing(make, key):
    """OneCycleLR cycles momentum (betas[0] for Adam) every step: no new kernel each time."""
    w = nn.Parameter(mg.tensor([1.0, 2.0]))
    opt = make(w)
    for step in range(5):
        with mg.profile() as prof:
            opt.step((w * w).sum())
        if step >= 2:
            assert prof.compiles == 0
        group = opt.param_groups[0]
        group[key] = (0.5 + 0.1 * step, 0.999) if key == "betas" else 0.5 + 0.1 * step


def test_zero_grad_without_set_to_none_gives_zeros():
    w = nn.Parameter(mg.tensor([1.0, 2.0]))
    opt = optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert w.grad.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None


def test_schedules():
    def lrs(make, count=6):
        opt = optim.SGD([nn.Parameter(mg.zeros(1))], lr=1.0)
        scheduler = make(opt)
        out = []
        for _ in range(count):
            out.append(opt.param_groups[0]["lr"])
            scheduler.step()
        return out

    assert lrs(lambda o: optim.lr_scheduler.StepLR(o, 2, 0.5)) == [1, 1, 0.5, 0.5, 0.25, 0.25]
    assert lrs(lambda o: optim.lr_scheduler.MultiStepLR(o, [1, 4], 0.1)) == pytest.approx(
        [1, 0.1, 0.1, 0.1, 0.01, 0.01]
    )
    assert lrs(lambda o: optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (e + 1)), 3) == pytest.approx(
        [1, 0.5, 1 / 3]
    )
    cosine = lrs(lambda o: optim.lr_scheduler.CosineAnnealingLR(o, T_max=4), 5)
    assert cosine == pytest.approx([1, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0])


def test_bad_arguments():
    with pytest.raises(mg.MetagraphError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(mg.MetagraphError, match="nesterov"):
        optim.SGD([nn.Parameter(mg.zeros(1))], lr=0.1, nesterov=True)


def _small_training_step():
    mg.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(64, 3))
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = mg.randn(8, 1, 4, 4), mg.tensor([0, 1, 2, 0, 1, 2, 0, 1])

    def step():
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return net, opt, step


def test_state_updated_in_place_is_computed_with_the_step():
    net, opt, step = _small_training_step()
    for _ in range(3):
        step()
        bn = net[1]
        for state in (bn.running_mean, bn.running_var, bn.num_batches_tracked):
            assert state.node.buffer is not None          # no lazy chain across steps
        buffers = [s["momentum_buffer"] for s in opt.state.values()]
        assert buffers and all(b.node.buffer is not None for b in buffers)
    assert net[1].num_batches_tracked.item() == 3


def test_reading_the_loss_after_step_does_not_recompute_the_forward_pass():
    _, _, step = _small_training_step()
    step().item()
    loss = step()
    with mg.profile() as prof:
        loss.item()
    shapes = [k.name.split("_")[1] for k in prof.kernels]
    sizes = [1 if shape == "scalar" else int(np.prod([int(n) for n in shape.split("x")])) for shape in shapes]
    # only the loss's own tail, over the logits: the backward computed the softmax's row max and
    # sum inside its own kernel (a row prologue), so they have no buffer and are computed again
    assert prof.launches <= 5 and max(sizes, default=0) <= 8, [k.name for k in prof.kernels]
