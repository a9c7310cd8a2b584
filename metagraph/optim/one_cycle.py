"""OneCycleLR: the 1cycle learning-rate (and momentum) policy, stepped after every batch."""
import math

from metagraph.errors import ArgumentError
from metagraph.optim.lr_scheduler import LRScheduler, _check_optimizer, _per_group


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the lr rises from max_lr / div_factor to max_lr over pct_start of total_steps,
    then anneals to that start / final_div_factor (three_phase: back to the start first, then down);
    with cycle_momentum, the momentum (Adam's beta1) moves the other way, max_momentum to base_momentum.
    Step it after every batch; stepping past total_steps is an error."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        _check_optimizer("OneCycleLR", optimizer)
        self.optimizer = optimizer
        self.total_steps = self._count_steps(total_steps, epochs, steps_per_epoch)
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ArgumentError(f"OneCycleLR: expected a float pct_start between 0 and 1, got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ArgumentError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', "
                                f"got {anneal_strategy!r}")
        self._anneal_func_type = anneal_strategy
        rise_end = float(pct_start * self.total_steps) - 1
        phases = [(rise_end, "initial_lr", "max_lr", "max_momentum", "base_momentum")]
        if three_phase:
            phases += [(float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr", "base_momentum",
                        "max_momentum"),
                       (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            phases += [(self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        keys = ("end_step", "start_lr", "end_lr", "start_momentum", "end_momentum")
        self._schedule_phases = [dict(zip(keys, phase)) for phase in phases]
        if last_epoch == -1:
            peaks = _per_group("OneCycleLR: max_lr", optimizer, max_lr)
            for group, peak in zip(optimizer.param_groups, peaks):
                group["initial_lr"] = peak / div_factor
                group["max_lr"] = peak
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._set_up_momentum(base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _count_steps(total_steps, epochs, steps_per_epoch):
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ArgumentError(f"OneCycleLR: expected a positive integer total_steps, "
                                    f"got {total_steps!r}")
            return total_steps
        if epochs is None or steps_per_epoch is None:
            raise ArgumentError("OneCycleLR: give either total_steps or both epochs and steps_per_epoch")
        for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
            if not isinstance(value, int) or value <= 0:
                raise ArgumentError(f"OneCycleLR: expected a positive integer {name}, got {value!r}")
        return epochs * steps_per_epoch

    def _set_up_momentum(self, base_momentum, max_momentum, last_epoch):
        defaults = self.optimizer.defaults
        if "momentum" not in defaults and "betas" not in defaults:
            raise ArgumentError(f"OneCycleLR: cycle_momentum needs an optimizer with momentum or betas, "
                                f"{type(self.optimizer).__name__} has neither; pass cycle_momentum=False")
        self.use_beta1 = "betas" in defaults
        peaks = _per_group("OneCycleLR: max_momentum", self.optimizer, max_momentum)
        bases = _per_group("OneCycleLR: base_momentum", self.optimizer, base_momentum)
        if last_epoch == -1:
            for group, peak, base in zip(self.optimizer.param_groups, peaks, bases):
                self._set_momentum(group, peak)
                group["max_momentum"], group["base_momentum"] = peak, base

    def _set_momentum(self, group, momentum):
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        """The lrs of step `last_epoch`; sets each group's momentum (or beta1) on the way."""
        step = self.last_epoch
        if step > self.total_steps:
            raise ArgumentError(f"OneCycleLR: tried to step {step} times; total_steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for index, phase in enumerate(self._schedule_phases):
                if step <= phase["end_step"] or index == len(self._schedule_phases) - 1:
                    break
                start = phase["end_step"]
            if phase["end_step"] == start:
                raise ArgumentError(f"OneCycleLR: phase {index} of the cycle has no steps; raise total_steps "
                                    "or change pct_start")
            pct = (step - start) / (phase["end_step"] - start)
            lrs.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
            if self.cycle_momentum:
                self._set_momentum(group, self._anneal(group[phase["start_momentum"]],
                                                       group[phase["end_momentum"]], pct))
        return lrs
