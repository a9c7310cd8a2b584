"""SGD, Adam, AdamW and RMSprop. Updates are in-place assigns built under no_grad, so a whole
training step (forward, backward, update) is realised, and fused, at once in step().

Hyperparameters that change between steps (the learning rate, Adam's bias corrections) enter the
graph as 0-d tensors, not constants, so a schedule does not change the graph's structure and
nothing is recompiled when they change."""
from metagraph import backend, creation
from metagraph.errors import ArgumentError, MetagraphError, user_location
from metagraph.grad import grad as compute_grad
from metagraph.grad import no_grad
from metagraph.ops.node import built_as, located


class Optimizer:
    defaults = {}

    def __init__(self, params, **hyper):
        params = list(params)
        if not params:
            raise ArgumentError(f"{type(self).__name__} got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        for group in groups:
            group = dict(group)
            group["params"] = list(group["params"])
            for key, value in {**self.defaults, **hyper}.items():
                group.setdefault(key, value)
            self.param_groups.append(group)
        self.state = {}
        for group in self.param_groups:
            self._check(group)

    def _check(self, group):
        if group["lr"] < 0:
            raise ArgumentError(f"{type(self).__name__}: invalid learning rate {group['lr']}")

    def zero_grad(self, set_to_none=True):
        """Forget every parameter's gradient (set_to_none=False: make it zeros instead, as PyTorch)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None if set_to_none or p.grad is None else creation.zeros_like(p.grad)

    def step(self, loss=None):
        """Update every parameter from its .grad; with `loss` (Jittor's habit) compute the grads first."""
        params = [p for group in self.param_groups for p in group["params"]]
        if loss is not None:
            trained = [p for p in params if p.requires_grad]
            for p, g in zip(trained, compute_grad(loss, trained)):
                p.grad = g
        touched, name = [], f"{type(self).__name__}.step"     # what its kernels are named after
        with no_grad(), located(user_location()):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state.setdefault(id(p), {})
                    built_as(name, self._update, (p, p.grad, state, group), {})
                    touched.extend([p, p.grad, *[v for v in state.values() if hasattr(v, "node")]])
        backend.realize([t.node for t in touched])          # the whole step, in one realisation

    @staticmethod
    def _scalar(value, like):
        """A hyperparameter as a 0-d tensor, not a constant of the graph: a schedule that changes it
        (lr, momentum, betas under OneCycleLR) then reuses the step's kernels instead of compiling
        new ones every step. (A device keeps one copy per value: runtime/opencl.py.)"""
        return creation.tensor(value, dtype=like.dtype)

    def state_dict(self):
        ids = {id(p): k for k, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state = {ids[key]: {name: (value.detach() if hasattr(value, "node") else value)
                            for name, value in entry.items()} for key, entry in self.state.items()}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [ids[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        params = [p for g in self.param_groups for p in g["params"]]
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise MetagraphError("load_state_dict: the number of parameter groups differs")
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            if len(saved["params"]) != len(group["params"]):
                raise MetagraphError("load_state_dict: a parameter group has a different size")
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {id(params[int(k)]): {name: (creation.tensor(value.numpy(), device=params[int(k)].device)
                                                  if hasattr(value, "node") else value)
                                           for name, value in entry.items()}
                      for k, entry in state_dict["state"].items()}


class SGD(Optimizer):
    defaults = dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)

    def _check(self, group):
        super()._check(group)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ArgumentError("SGD: nesterov momentum needs a momentum and zero dampening")

    def _update(self, p, g, state, group):
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + p * group["weight_decay"]
        if group["momentum"]:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = g.detach()
            else:
                buf = state["momentum_buffer"]
                buf.assign(buf * self._scalar(group["momentum"], p) + g * (1 - group["dampening"]))
            buf = state["momentum_buffer"]
            g = g + buf * self._scalar(group["momentum"], p) if group["nesterov"] else buf
        p -= g * self._scalar(group["lr"], p)


class Adam(Optimizer):
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False)
    decoupled = False

    def _update(self, p, g, state, group):
        beta1, beta2 = group["betas"]
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            if self.decoupled:
                p *= self._scalar(1 - group["lr"] * group["weight_decay"], p)
            else:
                g = g + p * group["weight_decay"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = creation.zeros_like(p)
            state["exp_avg_sq"] = creation.zeros_like(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = creation.zeros_like(p)
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.assign(m * self._scalar(beta1, p) + g * self._scalar(1 - beta1, p))
        v.assign(v * beta2 + g * g * (1 - beta2))
        second = v
        if group["amsgrad"]:
            state["max_exp_avg_sq"].assign(state["max_exp_avg_sq"].maximum(v))
            second = state["max_exp_avg_sq"]
        step_size = self._scalar(group["lr"] / (1 - beta1 ** state["step"]), p)
        correction = self._scalar((1 - beta2 ** state["step"]) ** 0.5, p)
        p -= m * step_size / (second.sqrt() / correction + group["eps"])


class AdamW(Adam):
    defaults = dict(Adam.defaults, weight_decay=1e-2)
    decoupled = True


class RMSprop(Optimizer):
    defaults = dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False)

    def _update(self, p, g, state, group):
        if group["weight_decay"]:
            g = g + p * group["weight_decay"]
        if not state:
            state["step"] = 0
            state["square_avg"] = creation.zeros_like(p)
            if group["momentum"]:
                state["momentum_buffer"] = creation.zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = creation.zeros_like(p)
        state["step"] += 1
        alpha = group["alpha"]
        square = state["square_avg"]
        square.assign(square * alpha + g * g * (1 - alpha))
        if group["centered"]:
            state["grad_avg"].assign(state["grad_avg"] * alpha + g * (1 - alpha))
            denominator = (square - state["grad_avg"] * state["grad_avg"]).sqrt() + group["eps"]
        else:
            denominator = square.sqrt() + group["eps"]
        lr = self._scalar(group["lr"], p)
        if group["momentum"]:
            buf = state["momentum_buffer"]
            buf.assign(buf * self._scalar(group["momentum"], p) + g / denominator)
            p -= buf * lr
        else:
            p -= g / denominator * lr
