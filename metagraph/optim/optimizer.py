"""SGD, Adam, AdamW and RMSprop. Updates are built under no_grad, so a whole training step (forward,
backward, update) is realised, and fused, at once in step().

A step runs for every iteration and every parameter (ResNet-18: 62 parameters), so it is built to
cost little Python:
- Each optimizer's update is a rule over nodes, `_rule(structure, p, g, state, scalars)` giving the
  parameter's new node and its state's. `structure` is what shapes the graph (flags, and which
  hyperparameters are zero); the rule reads nothing else of the group. It is recorded per
  signature and replayed (ops/recorded.py): later steps create its nodes without running it.
- Every number the rule reads is a 0-d buffer that the kernels read (`scalars`), never a constant
  of the graph: a schedule that changes any hyperparameter (lr, momentum and betas under
  OneCycleLR, Adam's bias corrections every step) reuses the step's kernels. Those buffers are
  made once per parameter group, dtype and set of values, and kept while the next step uses the
  same values: a step whose values did not change makes none.
A missing state entry (the first step) reaches the rule as None, which reads as zeros, or for SGD's
momentum as the first gradient, as PyTorch starts them."""
import math
import weakref

import numpy as np

from metagraph import backend, creation
from metagraph.errors import ArgumentError, MetagraphError, user_location
from metagraph.grad import grad as compute_grad
from metagraph.grad import no_grad
from metagraph.ops.math import cast, maximum, sqrt
from metagraph.ops.node import Node, built_as, fresh_id, located
from metagraph.ops.recorded import recorded
from metagraph.tensor import Tensor


class Optimizer:
    """The base class: param_groups and state as torch.optim's. A subclass gives its update as
    - `_structure(group)`: a tuple of what shapes the update's graph (flags, which values are zero);
    - `_state_names(structure)`: the names of its state tensors, in the order the rule takes them;
    - `_values(group, state)`: the numbers the rule reads this step, in its order (a subclass that
      counts steps counts this one here);
    - `_rule(structure, p, g, state, scalars)`: recorded (ops/recorded.py), over nodes: the
      parameter's new value and its state's, from the parameter, its gradient, its state (None for
      an entry not made yet) and the numbers as 0-d nodes."""
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
        self._scalars = {}       # (group, dtype, values) -> the 0-d buffers of the last step
        for group in self.param_groups:
            self._check(group)

    def _check(self, group):
        if group["lr"] < 0:
            raise ArgumentError(f"{type(self).__name__}: invalid learning rate {group['lr']}")

    def _structure(self, group):
        raise MetagraphError(f"{type(self).__name__} defines no update: a subclass of Optimizer gives "
                             "_structure, _state_names, _values and _rule (see Optimizer), or its own step()")

    def zero_grad(self, set_to_none=True):
        """Forget every parameter's gradient (set_to_none=False: make it zeros instead, as PyTorch)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None if set_to_none or p.grad is None else creation.zeros_like(p.grad)

    def step(self, loss=None):
        """Update every parameter from its .grad; with `loss` (Jittor's habit) compute the grads first."""
        if loss is not None:
            trained = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            for p, g in zip(trained, compute_grad(loss, trained)):
                p.grad = g
        with no_grad(), located(user_location()):       # its kernels are named after the step
            touched = built_as(f"{type(self).__name__}.step", self._updated, (), {})
        backend.realize(touched)          # the whole step, in one realisation

    def _updated(self):
        """Point every parameter with a gradient, and its state, at its updated value; returns the
        nodes to realise. (The old values are left to the graph alone, so that the kernels may write
        the new ones over them: runtime/donation.py.)"""
        touched, held = [], {}
        for index, group in enumerate(self.param_groups):
            structure = self._structure(group)
            names = self._state_names(structure)
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                state = self.state.setdefault(id(p), {})
                scalars = self._scalar_nodes(held, index, self._values(group, state), p.dtype)
                old = tuple([state[name].node if name in state else None for name in names])
                first = fresh_id()
                node, new = self._rule(structure, p.node, grad.node, old, scalars)
                p.node = _parameter_value(p, node, first)
                for name, value in zip(names, new):
                    if name in state:
                        state[name].node = value
                    else:
                        state[name] = Tensor(value)
                touched += (p.node, grad.node, *new)
        self._scalars = held
        return touched

    def _scalar_nodes(self, held, index, values, dtype):
        """The 0-d buffers (of `dtype`) holding `values` for parameter group `index`: this step's or
        the last step's when it had the same values (told apart by their bits: -0.0 is not 0.0),
        else new ones."""
        key = (index, dtype, *[float(value).hex() for value in values])
        nodes = held.get(key)
        if nodes is None:
            nodes = self._scalars.get(key)
            if nodes is None:
                nodes = tuple(Node("buffer", (), {}, (), dtype, requires_grad=False,
                                   buffer=np.array(value, dtype.np)) for value in values)
            held[key] = nodes
        return nodes

    def state_dict(self):
        """{"state": per parameter index, "param_groups": the groups with parameter indices}, as PyTorch's."""
        ids = {id(p): k for k, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state = {ids[key]: {name: (value.detach() if hasattr(value, "node") else value)
                            for name, value in entry.items()} for key, entry in self.state.items()}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [ids[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Take the hyperparameters and state of a state_dict() (PyTorch's layout)."""
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


def _parameter_value(p, node, first):
    """`node` as the next value of tensor `p`: a leaf that requires grad stays one (as
    Tensor._replace keeps it), owned by `p` so that backward() finds its .grad. A node the update
    built (its id at least `first`) is marked so; no other code has seen it yet."""
    old = p.node
    if not (old.leaf and old.requires_grad):
        return node
    if node.id < first or node.buffer is not None:
        node = Node(node.op, node.inputs, node.attrs, node.shape, node.dtype, buffer=node.buffer,
                    device=node.device)
    node.requires_grad = node.leaf = True
    node.owner = weakref.ref(p)
    return node


def _kept(like, value):
    """`value` in the dtype of `like` (state keeps its parameter's dtype)."""
    return value if value.dtype is like.dtype else cast(value, like.dtype)


class SGD(Optimizer):
    """Stochastic gradient descent, with momentum, dampening, Nesterov momentum and weight decay."""
    defaults = dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)

    def _check(self, group):
        super()._check(group)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ArgumentError("SGD: nesterov momentum needs a momentum and zero dampening")

    @staticmethod
    def _structure(group):
        return (bool(group["maximize"]), group["weight_decay"] != 0, group["momentum"] != 0,
                group["dampening"] != 0, bool(group["nesterov"]))

    @staticmethod
    def _state_names(structure):
        return ("momentum_buffer",) if structure[2] else ()

    @staticmethod
    def _values(group, state):
        return -group["lr"], group["weight_decay"], group["momentum"], 1 - group["dampening"]

    @staticmethod
    @recorded
    def _rule(structure, p, g, state, scalars):
        maximize, decays, has_momentum, damped, nesterov = structure
        minus_lr, weight_decay, momentum, undamped = scalars
        g = -g if maximize else g
        if decays:
            g = g + p * weight_decay
        if has_momentum:
            buf = state[0]
            if buf is None:
                buf = g                 # PyTorch's first buffer is the gradient itself
            else:
                buf = buf * momentum + (g * undamped if damped else g)
            g = g + buf * momentum if nesterov else buf
            state = (_kept(p, buf),)
        return _kept(p, p + g * minus_lr), state


class Adam(Optimizer):
    """Adam, with L2 weight decay (AdamW: decoupled), AMSGrad and maximize."""
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False)
    decoupled = False

    def _structure(self, group):
        return bool(group["maximize"]), group["weight_decay"] != 0, self.decoupled, bool(group["amsgrad"])

    @staticmethod
    def _state_names(structure):
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if structure[3] else ("exp_avg", "exp_avg_sq")

    @staticmethod
    def _values(group, state):
        """Counts the step, as PyTorch's state["step"]; the bias corrections follow from it."""
        step = state["step"] = state.get("step", 0) + 1
        lr, (beta1, beta2), decay = group["lr"], group["betas"], group["weight_decay"]
        return (lr, beta1, 1 - beta1, beta2, 1 - beta2, -lr / (1 - beta1 ** step),
                math.sqrt(1 - beta2 ** step), group["eps"], decay, 1 - lr * decay)

    @staticmethod
    @recorded
    def _rule(structure, p, g, state, scalars):
        maximize, decays, decoupled, amsgrad = structure
        _, beta1, rest1, beta2, rest2, minus_step_size, correction, eps, decay, shrink = scalars
        param = p
        g = -g if maximize else g
        if decays and decoupled:
            p = p * shrink
        elif decays:
            g = g + p * decay
        m, v = state[0], state[1]
        m = g * rest1 if m is None else m * beta1 + g * rest1
        v = g * g * rest2 if v is None else v * beta2 + g * g * rest2
        second, new = v, (_kept(param, m), _kept(param, v))
        if amsgrad:
            second = v if state[2] is None else maximum(state[2], v)
            new += (_kept(param, second),)
        return _kept(param, p + m * minus_step_size / (sqrt(second) / correction + eps)), new


class AdamW(Adam):
    """Adam with decoupled weight decay."""
    defaults = dict(Adam.defaults, weight_decay=1e-2)
    decoupled = True


class RMSprop(Optimizer):
    """RMSprop, with momentum, centering and weight decay."""
    defaults = dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False)

    @staticmethod
    def _structure(group):
        return group["weight_decay"] != 0, group["momentum"] != 0, bool(group["centered"])

    @staticmethod
    def _state_names(structure):
        return ("square_avg",) + (("momentum_buffer",) if structure[1] else ()) + \
            (("grad_avg",) if structure[2] else ())

    @staticmethod
    def _values(group, state):
        """Counts the step, as PyTorch's state["step"]."""
        state["step"] = state.get("step", 0) + 1
        alpha = group["alpha"]
        return -group["lr"], alpha, 1 - alpha, group["eps"], group["weight_decay"], group["momentum"]

    @staticmethod
    @recorded
    def _rule(structure, p, g, state, scalars):
        decays, has_momentum, centered = structure
        minus_lr, alpha, rest, eps, decay, momentum = scalars
        if decays:
            g = g + p * decay
        square = g * g * rest if state[0] is None else state[0] * alpha + g * g * rest
        new = (_kept(p, square),)
        if centered:
            average = state[-1]
            average = g * rest if average is None else average * alpha + g * rest
            denominator = sqrt(square - average * average) + eps
        else:
            denominator = sqrt(square) + eps
        if has_momentum:
            buf = state[1]
            buf = g / denominator if buf is None else buf * momentum + g / denominator
            new += (_kept(p, buf),)
            step = buf * minus_lr
        else:
            step = g / denominator * minus_lr
        if centered:
            new += (_kept(p, average),)
        return _kept(p, p + step), new
