"""How an optimizer's step is built (optim/optimizer.py): each parameter's update replayed from a rule
recorded per signature, every hyperparameter a 0-d buffer made once per group and value. What a
user sees: the values PyTorch gives whatever changes between steps, a step that builds the same
nodes every time, and a schedule that lowers and compiles nothing new."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import backend, nn, optim
from metagraph.compiler.graph import pending_graph
from metagraph.ops.node import fresh_id
from metagraph.pipeline import realize

OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.05)),
    ("SGD", dict(lr=0.1, momentum=0.8, nesterov=True, maximize=True)),
    ("Adam", dict(lr=0.05)),
    ("Adam", dict(lr=0.05, weight_decay=0.1, amsgrad=True, maximize=True)),
    ("AdamW", dict(lr=0.05, betas=(0.8, 0.99))),
    ("AdamW", dict(lr=0.05, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.1)),
]


def _schedule(group, step):
    """Every hyperparameter a schedule may move, moved: lr always, and momentum, betas, eps and
    weight decay (non-zero ones stay non-zero: zero is structure) where the group has them."""
    group["lr"] *= 0.7
    if group.get("momentum"):
        group["momentum"] = 0.5 + 0.1 * (step % 4)
    if "betas" in group:
        group["betas"] = (0.6 + 0.05 * step, group["betas"][1])
    if group.get("weight_decay"):
        group["weight_decay"] *= 1.5
    if "eps" in group:
        group["eps"] *= 2.0


@pytest.mark.parametrize("name, options", OPTIMIZERS)
def test_every_optimizer_follows_pytorch_while_its_hyperparameters_change(name, options):
    """Two parameter groups of two dtypes, a parameter whose gradient is missing every other step
    (Adam's step counts then differ within a group), and hyperparameters changed between steps."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal(5),
              rng.standard_normal((2, 2)).astype(np.float32)]
    ours = [nn.Parameter(mg.tensor(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]

    def groups(params):
        return [{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] * 2}]
    ours_opt = getattr(optim, name)(groups(ours), **options)
    theirs_opt = getattr(torch.optim, name)(groups(theirs), **options)
    for step in range(5):
        for params, opt in ((ours, ours_opt), (theirs, theirs_opt)):
            opt.zero_grad()
            used = params if step % 2 == 0 else [params[0], params[2]]
            sum((p ** 3).sum() for p in used).backward()
            opt.step()
            for group in opt.param_groups:
                _schedule(group, step)
    for mine, reference in zip(ours, theirs):
        expected = reference.detach().numpy()
        tolerance = 1e-5 if expected.dtype == np.float32 else 1e-10
        np.testing.assert_allclose(mine.numpy(), expected, rtol=tolerance, atol=tolerance)
        assert mine.is_leaf and mine.requires_grad


def _model():
    mg.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def _loss(model):
    x = mg.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    return (model(x) ** 2).mean()


class _Captured:
    """backend.realize, remembering the nodes of every realisation while it runs them."""

    def __init__(self):
        self.graphs = []

    def __call__(self, nodes):
        nodes = list(nodes)
        self.graphs.append(pending_graph([node for node in nodes if node.buffer is None]).nodes)
        return real_realize(nodes)


real_realize = backend.realize


@pytest.mark.parametrize("name, options", [("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
                                           ("Adam", dict(lr=0.01, amsgrad=True)),
                                           ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True))])
def test_a_step_builds_the_same_nodes_every_time_and_one_set_of_scalars(name, options, monkeypatch):
    """The nodes a step builds do not grow with the steps, and its hyperparameters are one set of 0-d
    buffers for the group, not one per parameter (ResNet-18's SGD step made 124 a step), kept from
    step to step while their values stay (Adam's bias corrections change every step)."""
    model = _model()
    optimizer = getattr(optim, name)(model.parameters(), **options)
    captured = _Captured()
    monkeypatch.setattr(backend, "realize", captured)
    built, scalars = [], []
    for _ in range(6):
        optimizer.zero_grad()
        _loss(model).backward()
        captured.graphs.clear()
        first = fresh_id()
        optimizer.step()
        built.append(fresh_id() - first)
        (graph,) = captured.graphs
        scalars.append({id(node): node for node in graph if node.op == "buffer" and node.shape == ()})
    # (the first step makes the state; the next two record the rule, first with amsgrad's maximum
    # still the same node as the second moment, then not)
    assert len(set(built[3:])) == 1, built
    count = len(optimizer._values(optimizer.param_groups[0], {"step": 1}))
    assert all(len(step) <= count for step in scalars), [len(step) for step in scalars]
    assert built[-1] <= 30 * len(list(model.parameters())), built     # (Adam with amsgrad: 24)
    if name != "Adam":
        assert scalars[-1].keys() == scalars[-2].keys()     # the same buffers: nothing new made


@pytest.fixture
def lowerings(monkeypatch):
    """The calls of lower.schedule, counted."""
    calls = []
    schedule = realize.schedule

    def counting(*args, **kwargs):
        calls.append(1)
        return schedule(*args, **kwargs)
    monkeypatch.setattr(realize, "schedule", counting)
    return calls


@pytest.mark.parametrize("name, options", OPTIMIZERS)
def test_changing_hyperparameters_between_steps_lowers_and_compiles_nothing(name, options, lowerings):
    model = _model()
    optimizer = getattr(optim, name)(model.parameters(), **options)
    for step in range(6):
        if step == 3:           # (the state's first values make graphs of their own, see above)
            seen = len(lowerings)
        with mg.profile() as prof:
            optimizer.zero_grad()
            _loss(model).backward()
            optimizer.step()
        for group in optimizer.param_groups:
            _schedule(group, step)
        if step >= 3:
            assert prof.compiles == 0
    assert len(lowerings) == seen


def test_a_changed_learning_rate_takes_effect_at_the_next_step():
    w = nn.Parameter(mg.tensor([1.0, -2.0], dtype=mg.float64))
    optimizer = optim.SGD([w], lr=0.5)
    expected = np.array([1.0, -2.0])
    for lr in (0.5, 0.25, 0.0, 0.125):
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        (w * w).sum().backward()
        optimizer.step()
        expected = expected - lr * 2 * expected
        np.testing.assert_array_equal(w.numpy(), expected)
