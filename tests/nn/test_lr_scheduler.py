"""Learning-rate schedules against PyTorch's, step by step: lrs, momentum and betas, state_dict."""
import copy
import pickle
import warnings

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn, optim
from metagraph.optim import lr_scheduler

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of")     # PyTorch's order check

GROUPS = [0.1, 0.02]          # two parameter groups with their own lrs


def _optimizers(name, **kwargs):
    ours = getattr(optim, name)([{"params": [nn.Parameter(mg.zeros(1))], "lr": lr} for lr in GROUPS],
                                **kwargs)
    theirs = getattr(torch.optim, name)([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
                                         for lr in GROUPS], **kwargs)
    return ours, theirs


def _hyper(optimizer):
    """Each group's lr, momentum and betas (NaN where the optimizer has none)."""
    return [(g["lr"], g.get("momentum", np.nan), *g.get("betas", (np.nan, np.nan)))
            for g in optimizer.param_groups]


def _step(scheduler, metric):
    if metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)


def compare(make, steps=30, optimizer="SGD", metrics=None, **kwargs):
    """Build the schedule on both sides and compare lrs (and momentum/betas) at every step."""
    ours, theirs = _optimizers(optimizer, **kwargs)
    mine, reference = make(lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    for step in range(steps):
        np.testing.assert_allclose(_hyper(ours), _hyper(theirs), rtol=1e-12, atol=0, err_msg=f"step {step}")
        np.testing.assert_allclose(mine.get_last_lr(), reference.get_last_lr(), rtol=1e-12, atol=0)
        theirs.step()                       # PyTorch warns when a schedule steps before its optimizer
        metric = None if metrics is None else metrics[step]
        _step(mine, metric)
        _step(reference, metric)
    return mine, reference


SCHEDULES = {
    "StepLR": lambda L, o: L.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda L, o: L.MultiStepLR(o, milestones=[2, 5, 5, 11], gamma=0.3),
    "LambdaLR": lambda L, o: L.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: 1 / (e + 1)]),
    "ConstantLR": lambda L, o: L.ConstantLR(o, factor=0.25, total_iters=4),
    "LinearLR": lambda L, o: L.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=7),
    "LinearLR-down": lambda L, o: L.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=10),
    "ExponentialLR": lambda L, o: L.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda L, o: L.CosineAnnealingLR(o, T_max=5, eta_min=0.01),   # past T_max too
    "warmup-cosine": lambda L, o: L.SequentialLR(
        o, [L.LinearLR(o, start_factor=0.1, total_iters=5), L.CosineAnnealingLR(o, T_max=20)],
        milestones=[5]),
    "constant-exponential-step": lambda L, o: L.SequentialLR(
        o, [L.ConstantLR(o, factor=0.1, total_iters=4), L.ExponentialLR(o, gamma=0.9), L.StepLR(o, 2)],
        milestones=[4, 9]),
    "nested-sequential": lambda L, o: L.SequentialLR(
        o, [L.SequentialLR(o, [L.ConstantLR(o, 0.5, 2), L.ExponentialLR(o, 0.8)], [3]), L.StepLR(o, 4)], [8]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_matches_torch(name):
    compare(SCHEDULES[name])


ONE_CYCLE = {
    "sgd-two-groups": ("SGD", dict(momentum=0.9), lambda L, o: L.OneCycleLR(o, [1.0, 0.5], total_steps=30)),
    "adam-betas": ("Adam", {}, lambda L, o: L.OneCycleLR(o, 0.3, total_steps=30, base_momentum=0.8,
                                                         max_momentum=[0.9, 0.99])),
    "three-phase-linear": ("AdamW", {}, lambda L, o: L.OneCycleLR(
        o, 1.0, epochs=3, steps_per_epoch=10, pct_start=0.25, anneal_strategy="linear", three_phase=True)),
    "no-momentum-cycle": ("RMSprop", {}, lambda L, o: L.OneCycleLR(
        o, 0.1, total_steps=30, cycle_momentum=False, div_factor=10.0, final_div_factor=100.0)),
    "sgd-without-momentum": ("SGD", {}, lambda L, o: L.OneCycleLR(o, 1.0, total_steps=30, pct_start=0.5)),
}


@pytest.mark.parametrize("name", sorted(ONE_CYCLE))
def test_one_cycle_matches_torch(name):
    optimizer, kwargs, make = ONE_CYCLE[name]
    mine, reference = compare(make, steps=30, optimizer=optimizer, **kwargs)
    assert mine.get_last_lr() == reference.get_last_lr()       # step total_steps is allowed, the next is not
    with pytest.raises(ValueError, match="OneCycleLR: tried to step 31 times"):
        mine.step()


def test_two_schedules_stepped_together_compose():
    """The schedules are chainable, as PyTorch's: each scales the lr the other set."""
    ours, theirs = _optimizers("SGD")
    mine = [lr_scheduler.ExponentialLR(ours, 0.9), lr_scheduler.StepLR(ours, 3, 0.5)]
    reference = [torch.optim.lr_scheduler.ExponentialLR(theirs, 0.9),
                 torch.optim.lr_scheduler.StepLR(theirs, 3, 0.5)]
    for _ in range(12):
        theirs.step()
        for scheduler in mine + reference:
            scheduler.step()
        assert _hyper(ours) == _hyper(theirs)


def test_one_cycle_resumes_from_last_epoch():
    ours, theirs = _optimizers("SGD", momentum=0.9)
    mine = lr_scheduler.OneCycleLR(ours, 1.0, total_steps=20)
    reference = torch.optim.lr_scheduler.OneCycleLR(theirs, 1.0, total_steps=20)
    for _ in range(7):
        theirs.step()
        mine.step()
        reference.step()
    mine = lr_scheduler.OneCycleLR(ours, 1.0, total_steps=20, last_epoch=mine.last_epoch)
    reference = torch.optim.lr_scheduler.OneCycleLR(theirs, 1.0, total_steps=20,
                                                    last_epoch=reference.last_epoch)
    assert _hyper(ours) == _hyper(theirs)


METRICS = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.89, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9] * 2

PLATEAUS = {
    "defaults-patience-1": lambda L, o: L.ReduceLROnPlateau(o, patience=1),
    "cooldown-min-lr-list": lambda L, o: L.ReduceLROnPlateau(o, patience=1, cooldown=2, min_lr=[0.001, 0.0]),
    "max-abs-eps": lambda L, o: L.ReduceLROnPlateau(o, mode="max", threshold_mode="abs", threshold=0.01,
                                                    patience=0, factor=0.5, eps=0.003),
    "min-abs": lambda L, o: L.ReduceLROnPlateau(o, threshold_mode="abs", threshold=0.05, patience=2,
                                                factor=0.2, min_lr=0.005),
    "max-rel": lambda L, o: L.ReduceLROnPlateau(o, mode="max", threshold=0.1, patience=0),
}


@pytest.mark.parametrize("name", sorted(PLATEAUS))
def test_reduce_on_plateau_matches_torch(name):
    mine, reference = compare(PLATEAUS[name], metrics=METRICS)
    assert (mine.best, mine.num_bad_epochs, mine.cooldown_counter, mine.last_epoch) == \
        (reference.best, reference.num_bad_epochs, reference.cooldown_counter, reference.last_epoch)


def test_reduce_on_plateau_takes_a_tensor_metric():
    ours, _ = _optimizers("SGD")
    scheduler = lr_scheduler.ReduceLROnPlateau(ours, patience=0)
    scheduler.step(mg.tensor(1.0))
    scheduler.step(mg.tensor([2.0]))
    assert scheduler.get_last_lr() == pytest.approx([0.01, 0.002])


def test_step_with_an_epoch_uses_the_closed_form():
    ours, theirs = _optimizers("SGD")
    mine, reference = lr_scheduler.StepLR(ours, 2, 0.5), torch.optim.lr_scheduler.StepLR(theirs, 2, 0.5)
    with pytest.warns(UserWarning, match="deprecated"):
        mine.step(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference.step(5)
    assert mine.get_last_lr() == reference.get_last_lr() and mine.last_epoch == 5


@pytest.mark.parametrize("name", ["warmup-cosine", "nested-sequential", "LambdaLR", "CosineAnnealingLR"])
def test_state_dict_round_trip(name):
    """A schedule restored from its state_dict (and its optimizer's) continues as the original."""
    make = SCHEDULES[name]
    ours, _ = _optimizers("SGD")
    scheduler = make(lr_scheduler, ours)
    for _ in range(7):
        scheduler.step()
    state = pickle.loads(pickle.dumps(scheduler.state_dict()))      # plain data: lambdas are left out
    optimizer_state = copy.deepcopy(ours.state_dict())
    restored_optimizer, _ = _optimizers("SGD")
    restored = make(lr_scheduler, restored_optimizer)
    restored_optimizer.load_state_dict(optimizer_state)
    restored.load_state_dict(state)
    for _ in range(15):
        scheduler.step()
        restored.step()
        assert restored.get_last_lr() == scheduler.get_last_lr()
        assert _hyper(restored_optimizer) == _hyper(ours)


def test_one_cycle_and_plateau_state_dict_round_trip():
    for make, metric in [(ONE_CYCLE["adam-betas"][2], None), (PLATEAUS["cooldown-min-lr-list"], 0.5)]:
        optimizer = "Adam" if metric is None else "SGD"
        ours, _ = _optimizers(optimizer)
        scheduler = make(lr_scheduler, ours)
        for _ in range(9):
            _step(scheduler, metric)
        state = pickle.loads(pickle.dumps(scheduler.state_dict()))
        restored_optimizer, _ = _optimizers(optimizer)
        restored = make(lr_scheduler, restored_optimizer)
        restored_optimizer.load_state_dict(copy.deepcopy(ours.state_dict()))
        restored.load_state_dict(state)
        for _ in range(10):
            _step(scheduler, metric)
            _step(restored, metric)
            assert restored.get_last_lr() == scheduler.get_last_lr()
            assert _hyper(restored_optimizer) == _hyper(ours)


def test_state_dict_keys_match_torch():
    ours, theirs = _optimizers("SGD", momentum=0.9)
    mine = lr_scheduler.OneCycleLR(ours, 1.0, total_steps=10)
    reference = torch.optim.lr_scheduler.OneCycleLR(theirs, 1.0, total_steps=10)
    internal = {"_get_lr_called_within_step"}           # PyTorch's warning bookkeeping
    assert set(mine.state_dict()) == set(reference.state_dict()) - internal


def test_resuming_needs_initial_lr():
    ours, _ = _optimizers("SGD")
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.StepLR(ours, 2, last_epoch=3)


class _NoMomentum(optim.Optimizer):
    defaults = dict(lr=0.1)


@pytest.mark.parametrize("make, error, message", [
    (lambda o: lr_scheduler.StepLR(object(), 2), TypeError, "is not an Optimizer"),
    (lambda o: lr_scheduler.ConstantLR(o, factor=1.5), ValueError, "ConstantLR: factor"),
    (lambda o: lr_scheduler.LinearLR(o, start_factor=0.0), ValueError, "LinearLR: start_factor"),
    (lambda o: lr_scheduler.LinearLR(o, end_factor=2.0), ValueError, "LinearLR: end_factor"),
    (lambda o: lr_scheduler.LambdaLR(o, [lambda e: 1.0]), ValueError, "one value per parameter group"),
    (lambda o: lr_scheduler.SequentialLR(o, [], []), ValueError, "at least one scheduler"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(o, 2)], [3]), ValueError,
     "one milestone fewer"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(_optimizers("SGD")[0], 2)], []), ValueError,
     "another optimizer"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.ReduceLROnPlateau(o)], []), ValueError,
     "ReduceLROnPlateau"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=1.0), ValueError, "factor must be < 1.0"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, mode="up"), ValueError, "mode must be 'min' or 'max'"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, threshold_mode="x"), ValueError, "threshold_mode"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, min_lr=[0.1]), ValueError, "one value per parameter group"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0), ValueError, "total_steps or both epochs"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0, total_steps=0), ValueError, "positive integer total_steps"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0, epochs=2, steps_per_epoch=1.5), ValueError, "steps_per_epoch"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0, total_steps=10, pct_start=1), ValueError, "float pct_start"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0, total_steps=10, anneal_strategy="exp"), ValueError,
     "anneal_strategy"),
    (lambda o: lr_scheduler.OneCycleLR(o, [1.0], total_steps=10), ValueError, "max_lr must have one value"),
    (lambda o: lr_scheduler.OneCycleLR(o, 1.0, total_steps=4, pct_start=0.25), ValueError, "has no steps"),
    (lambda o: lr_scheduler.OneCycleLR(_NoMomentum([nn.Parameter(mg.zeros(1))]), 1.0, total_steps=10),
     ValueError, "momentum or betas"),
])
def test_bad_arguments(make, error, message):
    ours, _ = _optimizers("SGD")
    with pytest.raises(error, match=message):
        make(ours)
