"""Loss scaling, as PyTorch's torch.amp.GradScaler, with a static mode beside the dynamic one.

A float16 gradient smaller than 2^-24 is 0; scaling the loss (and so every gradient) by S keeps
such gradients, and dividing them by S before the optimizer's step restores their values. The
dynamic scale starts at 2^16, is multiplied by `backoff_factor` (0.5) when a step's gradients hold
an inf or NaN (that step is skipped) and by `growth_factor` (2) after `growth_interval` (2000)
steps in a row without one: PyTorch's rule, computed in float32 as its scale tensor is, so both
give the same scales step for step. `dynamic=False` keeps the scale fixed (steps with an inf or
NaN are still skipped), the strategy a fixed-loss-scale study compares against.

Finding an inf is a sync point: the gradients are computed then, together with the check, and
kept; the division by the scale is a lazy multiply that the optimizer's update kernel absorbs.
"""
import math

import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, MetagraphError

READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Scales a loss and unscales the gradients its backward pass gives, skipping the optimizer's
    steps whose gradients overflowed and adapting the scale (PyTorch's GradScaler semantics)."""

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, dynamic=True):
        if device != "cpu":
            raise ArgumentError(f"GradScaler: device must be 'cpu' (metagraph's one device), "
                                f"got {device!r}")
        self._enabled, self._dynamic = bool(enabled), bool(dynamic)
        if self._enabled and self._dynamic:
            if growth_factor <= 1.0:
                raise ArgumentError(f"GradScaler: the growth factor must be > 1.0, got {growth_factor}")
            if backoff_factor >= 1.0:
                raise ArgumentError(f"GradScaler: the backoff factor must be < 1.0, "
                                    f"got {backoff_factor}")
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise ArgumentError(f"GradScaler: init_scale must be a positive finite number, "
                                f"got {init_scale!r}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ArgumentError(f"GradScaler: growth_interval must be a positive int, "
                                f"got {growth_interval!r}")
        self._init_scale = float(init_scale)
        self._scale = None               # float32, set at the first scale() (as PyTorch's)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self._optimizers = {}            # id(optimizer) -> {"stage": ..., "found_inf": bool or None}

    # ---- the training loop's calls --------------------------------------------------------
    def scale(self, outputs):
        """outputs (a Tensor, or nested lists and tuples of them) times the current scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = np.float32(self._init_scale)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(value) for value in outputs)
        if not hasattr(outputs, "node"):
            raise ArgumentError(f"GradScaler.scale: outputs must be a Tensor or an iterable of Tensors, "
                                f"got {type(outputs).__name__}")
        return outputs * float(self._scale)

    def unscale_(self, optimizer):
        """Divide the gradients of `optimizer`'s parameters by the scale now (before clipping them),
        noting whether any holds an inf or NaN. Once per optimizer between update() calls."""
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] == UNSCALED:
            raise MetagraphError("GradScaler.unscale_() has already been called on this optimizer since "
                                "the last update()")
        if state["stage"] == STEPPED:
            raise MetagraphError("GradScaler.unscale_() is being called after step()")
        state["found_inf"] = self._unscale_grads(optimizer)
        state["stage"] = UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(*args, **kwargs) unless this iteration's gradients hold an inf or NaN
        (then None: the step is skipped); unscales first unless unscale_() did."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise ArgumentError("GradScaler.step: a closure is not supported while the scaler is enabled")
        self._require_scale("step")
        state = self._state(optimizer)
        if state["stage"] == STEPPED:
            raise MetagraphError("GradScaler.step() has already been called since the last update()")
        if state["stage"] == READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = STEPPED
        return result

    def update(self, new_scale=None):
        """The scale for the next iteration: `new_scale` if given, else backed off after an
        overflow in any optimizer's step, grown after `growth_interval` clean steps in a row
        (unchanged in static mode)."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            value = float(new_scale.item() if hasattr(new_scale, "item") else new_scale)
            if not (math.isfinite(value) and value > 0):
                raise ArgumentError(f"GradScaler.update: new_scale must be a positive finite number, "
                                    f"got {new_scale!r}")
            self._scale = np.float32(value)
        else:
            checked = [state["found_inf"] for state in self._optimizers.values()
                       if state["found_inf"] is not None]
            if not checked:
                raise MetagraphError("GradScaler.update: no inf checks were recorded: call step(optimizer) "
                                    "(or unscale_) first")
            if self._dynamic:
                self._grow_or_back_off(any(checked))
        self._optimizers = {}

    # ---- state -----------------------------------------------------------------------------
    def get_scale(self):
        """The current scale as a Python float (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    def get_growth_factor(self):
        """The factor the scale grows by after growth_interval clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        """Change the growth factor."""
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self):
        """The factor the scale shrinks by after a step with an inf or NaN."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        """Change the backoff factor."""
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self):
        """How many clean steps in a row grow the scale."""
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        """Change the growth interval."""
        self._growth_interval = int(new_interval)

    def is_enabled(self):
        """Whether the scaler scales at all (enabled=False makes every call a pass-through)."""
        return self._enabled

    def is_dynamic(self):
        """Whether the scale adapts (False: static loss scaling)."""
        return self._dynamic

    def state_dict(self):
        """PyTorch's five entries (scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker), or {} when disabled: torch's GradScaler loads it, and this one its."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict):
        """Restore what state_dict() (this class's or PyTorch's) returned."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise ArgumentError("GradScaler.load_state_dict: the state dict is empty, possibly because it "
                                "was saved from a disabled GradScaler")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - \
            set(state_dict)
        if missing:
            raise ArgumentError(f"GradScaler.load_state_dict: missing entries {sorted(missing)}")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = np.float32(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])

    # ---- inside ----------------------------------------------------------------------------
    def _state(self, optimizer):
        return self._optimizers.setdefault(id(optimizer), {"stage": READY, "found_inf": None})

    def _require_scale(self, call):
        if self._scale is None:
            raise MetagraphError(f"GradScaler.{call}: no scale yet: scale the loss with scaler.scale(loss) "
                                "earlier in the iteration")

    def _unscale_grads(self, optimizer):
        """Replace each gradient by gradient / scale (one float32 multiply by the float32 reciprocal,
        as PyTorch's, left lazy for the optimizer's kernels); whether any gradient held an inf or
        NaN. Computes the gradients and the check (a sync)."""
        import metagraph as mg          # this package is imported by ops, before the tensor layer
        inverse = float(np.float32(1.0 / np.float64(self._scale)))
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return False
        checks, unscaled = [], []
        for p in params:
            grad = p.grad
            if grad.dtype == dtypes.float16:
                raise DTypeError("GradScaler.unscale_: attempting to unscale float16 gradients (keep the "
                                 "parameters in float32 and let autocast cast them, as PyTorch requires)")
            checks.append(mg.isfinite(grad).all())
            wide = grad.float() if grad.dtype in dtypes.LOW_PRECISION else grad
            unscaled.append((wide * inverse).to(grad.dtype))
        finite = mg.stack(checks).all()
        mg.sync(finite, *(p.grad for p in params))      # the gradients, kept; unscaled lazily
        for p, grad in zip(params, unscaled):
            p.grad = grad
        return not finite.item()

    def _grow_or_back_off(self, found_inf):
        """PyTorch's _amp_update_scale_ on the CPU: the float32 scale times a double factor,
        rounded to float32."""
        if found_inf:
            self._scale = np.float32(float(self._scale) * self._backoff_factor)
            self._growth_tracker = 0
            return
        successful = self._growth_tracker + 1
        if successful == self._growth_interval:
            with np.errstate(over="ignore"):
                grown = np.float32(float(self._scale) * self._growth_factor)
            if np.isfinite(grown):
                self._scale = grown
            self._growth_tracker = 0
        else:
            self._growth_tracker = successful
