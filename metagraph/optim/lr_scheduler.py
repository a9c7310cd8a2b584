"""Learning-rate schedules, as torch.optim.lr_scheduler: each step() sets the lr of every parameter group.

The schedules are chainable, as PyTorch's: get_lr() scales the group's current lr, so two schedules
stepped together compose, and SequentialLR can hand the lr from one to the next. step(epoch), which
PyTorch deprecates, jumps to an epoch through the closed form where a schedule has one."""
import math
import types
import warnings
from bisect import bisect_right
from collections import Counter

from metagraph.errors import ArgumentError
from metagraph.optim.optimizer import Optimizer

EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` is deprecated, as in PyTorch: call `scheduler.step()`; "
    "with an epoch, the closed form is used where a schedule has one")


def _check_optimizer(name, optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{name}: {type(optimizer).__name__} is not an Optimizer")


def _per_group(name, optimizer, value):
    """One value per parameter group: a list or tuple of that length, or one value for all."""
    count = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ArgumentError(f"{name} must have one value per parameter group: got {len(value)} "
                                f"values for {count} groups")
        return list(value)
    return [value] * count


def _group_lrs(optimizer):
    return [group["lr"] for group in optimizer.param_groups]


class LRScheduler:
    """Base class of the schedules: subclasses compute the next lrs in get_lr()."""
    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(type(self).__name__, optimizer)
        self.optimizer = optimizer
        for index, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: param 'initial_lr' is not specified in "
                               f"param_groups[{index}] when resuming with last_epoch={last_epoch}; "
                               "load the optimizer's state first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        """The step every schedule takes when it is made: it sets the lrs of epoch 0."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        """The lrs of epoch `last_epoch`, one per parameter group."""
        raise NotImplementedError(f"{type(self).__name__} has no get_lr()")

    def get_last_lr(self):
        """The lrs this schedule set last, one per parameter group."""
        return list(self._last_lr)

    def step(self, epoch=None):
        """Advance one epoch (or, deprecated, jump to `epoch`) and set the groups' lrs."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = _group_lrs(self.optimizer)

    def state_dict(self):
        """Everything but the optimizer, as PyTorch's."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        """Restore a state_dict(); restore the optimizer's too, which holds the current lrs."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = initial lr * lr_lambda(epoch); one function, or one per parameter group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer("LambdaLR", optimizer)
        self.lr_lambdas = _per_group("LambdaLR: lr_lambda", optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self):
        """Plain functions are not saved; a callable object's attributes are (as PyTorch's)."""
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else dict(fn.__dict__)
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        """Restore a state_dict(), and the saved attributes of callable objects among lr_lambdas."""
        state = dict(state_dict)
        saved = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, attributes in zip(self.lr_lambdas, saved):
            if attributes is not None:
                fn.__dict__.update(attributes)


class StepLR(LRScheduler):
    """Multiply the lr by gamma every step_size epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _group_lrs(self.optimizer)
        return [lr * self.gamma for lr in _group_lrs(self.optimizer)]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the lr by gamma at each milestone (twice at a milestone listed twice)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return _group_lrs(self.optimizer)
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in _group_lrs(self.optimizer)]

    def _get_closed_form_lr(self):
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [base * self.gamma ** passed for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """Multiply the lr by `factor` for the first total_iters epochs."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 <= factor <= 1:
            raise ArgumentError(f"ConstantLR: factor must be between 0 and 1, got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = _group_lrs(self.optimizer)
        if self.last_epoch == 0:
            return [lr * self.factor for lr in lrs]
        if self.last_epoch != self.total_iters:
            return lrs
        return [lr * (1.0 / self.factor) for lr in lrs]

    def _get_closed_form_lr(self):
        factor = self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)
        return [base * factor for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale the lr by a factor going linearly from start_factor to end_factor over total_iters epochs."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1:
            raise ArgumentError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ArgumentError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = _group_lrs(self.optimizer)
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in lrs]
        if self._is_initial or self.last_epoch > self.total_iters:
            return lrs
        change = self.end_factor - self.start_factor
        ratio = 1.0 + change / (self.total_iters * self.start_factor + (self.last_epoch - 1) * change)
        return [lr * ratio for lr in lrs]

    def _get_closed_form_lr(self):
        done = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base * (self.start_factor + (self.end_factor - self.start_factor) * done)
                for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the lr by gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _group_lrs(self.optimizer)
        return [lr * self.gamma for lr in _group_lrs(self.optimizer)]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Anneal the lr from its initial value to eta_min along a half cosine of T_max epochs."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _group_lrs(self.optimizer)
        if self._step_count == 1 and self.last_epoch > 0:          # resumed: no lr to scale yet
            return self._get_closed_form_lr()
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:     # the cosine's trough
            rise = (1 - math.cos(math.pi / self.T_max)) / 2
            return [lr + (base - self.eta_min) * rise
                    for base, lr in zip(self.base_lrs, _group_lrs(self.optimizer))]
        ratio = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / \
            (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max))
        return [ratio * (lr - self.eta_min) + self.eta_min for lr in _group_lrs(self.optimizer)]

    def _get_closed_form_lr(self):
        phase = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * phase for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Run `schedulers` one after another, switching at each of `milestones` (epochs)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ArgumentError("SequentialLR expects at least one scheduler, got none")
        for index, scheduler in enumerate(schedulers):
            if not hasattr(scheduler, "optimizer"):
                raise TypeError(f"SequentialLR: the scheduler at index {index} has no `optimizer`")
            if isinstance(scheduler, ReduceLROnPlateau):
                raise ArgumentError(f"SequentialLR does not support ReduceLROnPlateau (index {index}): its "
                                    "step() needs a metric")
            if scheduler.optimizer is not optimizer:
                raise ArgumentError(f"SequentialLR: the scheduler at index {index} "
                                    f"({type(scheduler).__name__}) belongs to another optimizer")
        if len(milestones) != len(schedulers) - 1:
            raise ArgumentError(f"SequentialLR expects one milestone fewer than schedulers: got "
                                f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # Making each scheduler stepped it once: undo that, then start the one active at epoch 0.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._undo_initial_steps(self)
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    @classmethod
    def _undo_initial_steps(cls, scheduler):
        if hasattr(scheduler, "_schedulers"):
            for inner in scheduler._schedulers:
                cls._undo_initial_steps(inner)
        elif hasattr(scheduler, "last_epoch"):
            scheduler.last_epoch -= 1

    def step(self):
        """Step the scheduler active at the next epoch; at a milestone it restarts from its epoch 0."""
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        """Its own state and each scheduler's."""
        state = {key: value for key, value in self.__dict__.items()
                 if key not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [scheduler.state_dict() for scheduler in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        """Restore a state_dict(), each scheduler's included."""
        state = dict(state_dict)
        saved = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, scheduler_state in zip(self._schedulers, saved):
            scheduler.load_state_dict(scheduler_state)


class ReduceLROnPlateau(LRScheduler):
    """Multiply the lr by `factor` when a metric, given to step(metric), stops improving."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        _check_optimizer("ReduceLROnPlateau", optimizer)
        if factor >= 1.0:
            raise ArgumentError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor}")
        if mode not in ("min", "max"):
            raise ArgumentError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ArgumentError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got "
                                f"{threshold_mode!r}")
        self.optimizer = optimizer
        self.factor, self.patience, self.cooldown, self.eps = factor, patience, cooldown, eps
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.default_min_lr = None if isinstance(min_lr, (list, tuple)) else min_lr
        self.min_lrs = _per_group("ReduceLROnPlateau: min_lr", optimizer, min_lr)
        self.last_epoch = 0
        self._last_lr = _group_lrs(optimizer)
        self._reset()

    def _reset(self):
        self.best = math.inf if self.mode == "min" else -math.inf
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self):
        """Whether the lr was reduced less than `cooldown` epochs ago."""
        return self.cooldown_counter > 0

    def step(self, metrics, epoch=None):
        """Record one epoch's metric (a number or a one-element tensor: a sync) and reduce the lr
        after more than `patience` epochs without improvement."""
        current = float(metrics)
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0        # bad epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = _group_lrs(self.optimizer)

    def _reduce_lr(self):
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise ArgumentError(f"ReduceLROnPlateau: the optimizer has {len(groups)} parameter groups "
                                    f"but min_lr has {len(self.min_lrs)} values; update `min_lrs`")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs):
            new_lr = max(group["lr"] * self.factor, min_lr)
            if group["lr"] - new_lr > self.eps:        # changes smaller than eps are ignored
                group["lr"] = new_lr

    def _is_better(self, value, best):
        if self.mode == "min" and self.threshold_mode == "rel":
            return value < best * (1.0 - self.threshold)
        if self.mode == "min":
            return value < best - self.threshold
        if self.threshold_mode == "rel":
            return value > best * (1.0 + self.threshold)
        return value > best + self.threshold


from metagraph.optim.one_cycle import OneCycleLR  # noqa: E402,F401  (it builds on LRScheduler)
