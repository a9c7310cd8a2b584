"""Module backward hooks, as PyTorch's register_full_backward_hook and _pre_hook.

A call of a module with backward hooks passes each positional tensor argument that requires grad
through an identity node, and each tensor it returns through another: the gradients reaching the
input identities are the module's own contribution to its inputs' gradients (not that of a
residual branch around it), and those reaching the output identities are its grad_output. The
output identities form one gradient group (ops/autograd.py), whose hook runs the pre-hooks; the
input identities form another, whose hook runs the full hooks with every grad_input at once."""
from metagraph.errors import MetagraphError, ShapeError
from metagraph.ops import autograd, math as m
from metagraph.ops.table import apply
from metagraph.tensor import Tensor


def _identity(tensor):
    """The same value through a node of its own (a cast to its own dtype is never folded here)."""
    return Tensor(apply("cast", tensor.node, dtype=tensor.dtype))


def _needs_grad(value):
    return isinstance(value, Tensor) and value.requires_grad


class BackwardHookCall:
    """One call of a module with backward hooks: wraps its inputs and outputs, and calls the module's
    hooks (read when the backward pass reaches them, as in PyTorch) with the call's gradients."""

    def __init__(self, module, args):
        self.module = module
        self.num_inputs = len(args)
        self.num_outputs = 1
        self.grad_output = None
        self.input_positions = [k for k, arg in enumerate(args) if _needs_grad(arg)]
        self.input_args = [(arg.shape, arg.dtype) if isinstance(arg, Tensor) else None for arg in args]
        self.input_shapes = [arg and arg[0] for arg in self.input_args]
        self.output_positions = []

    def wrap_inputs(self, args):
        args = list(args)
        for k in self.input_positions:
            args[k] = _identity(args[k])
        if self.input_positions:
            self.inputs = autograd.GradGroup([args[k].node for k in self.input_positions], self._on_inputs)
        return tuple(args)

    def wrap_outputs(self, result):
        single = isinstance(result, Tensor)
        outputs = [result] if single else list(result) if isinstance(result, (tuple, list)) else None
        if outputs is None:
            return result
        self.num_outputs = len(outputs)
        self.output_positions = [k for k, value in enumerate(outputs) if _needs_grad(value)]
        self.output_shapes = [value.shape if isinstance(value, Tensor) else None for value in outputs]
        if not self.output_positions:
            return result
        for k in self.output_positions:
            outputs[k] = _identity(outputs[k])
        self.outputs = autograd.GradGroup([outputs[k].node for k in self.output_positions], self._on_outputs)
        return outputs[0] if single else type(result)(outputs)

    # ---- called by the backward pass -----------------------------------------------------------
    def _on_outputs(self, grads):
        grad_output = self._spread(grads, self.output_positions, self.num_outputs)
        for hook in tuple(self.module._backward_pre_hooks.values()):
            replaced = hook(self.module, grad_output)
            if replaced is not None:
                grad_output = self._checked(replaced, "backward pre-hook", "grad_output",
                                            self.output_shapes)
        self.grad_output = grad_output
        if not self.input_positions:        # nothing below to wait for: the full hooks run now
            grad_input = (None,) * self.num_inputs
            for hook in tuple(self.module._backward_hooks.values()):
                if hook(self.module, grad_input, grad_output) is not None:
                    raise MetagraphError(f"{type(self.module).__name__}: a backward hook returned a "
                                         "grad_input although no input requires grad")
        return self._gathered(grad_output, self.output_positions, self.outputs)

    def _on_inputs(self, grads):
        grad_input = list(self._spread(grads, self.input_positions, self.num_inputs))
        for k, arg in enumerate(self.input_args):      # PyTorch's: zeros for every other tensor
            if grad_input[k] is None and arg is not None:
                grad_input[k] = Tensor(m.const(0, *arg))
        grad_input = tuple(grad_input)
        grad_output = self.grad_output or (None,) * self.num_outputs
        for hook in tuple(self.module._backward_hooks.values()):
            replaced = hook(self.module, grad_input, grad_output)
            if replaced is not None:
                grad_input = self._checked(replaced, "backward hook", "grad_input", self.input_shapes)
        return self._gathered(grad_input, self.input_positions, self.inputs)

    @staticmethod
    def _spread(grads, positions, count):
        spread = [None] * count
        for k, grad in zip(positions, grads):
            spread[k] = None if grad is None else Tensor(grad)
        return tuple(spread)

    @staticmethod
    def _gathered(values, positions, group):
        """The group's gradient nodes from a hook's tuple (None: no gradient flows there)."""
        return [None if values[k] is None else m.cast(values[k].node, member.dtype)
                for k, member in zip(positions, group.members)]

    def _checked(self, replaced, what, name, shapes):
        replaced = tuple(replaced) if isinstance(replaced, (tuple, list)) else (replaced,)
        where = f"{type(self.module).__name__}: a {what} returned"
        if len(replaced) != len(shapes):
            raise MetagraphError(f"{where} {len(replaced)} values for {name}, expected {len(shapes)}")
        for k, (value, shape) in enumerate(zip(replaced, shapes)):
            if value is None:
                continue
            if not isinstance(value, Tensor) or (shape is not None and value.shape != shape):
                got = f"shape {value.shape}" if isinstance(value, Tensor) else type(value).__name__
                raise ShapeError(f"{where} {name}[{k}] of {got}, expected None or a tensor of shape {shape}")
        return replaced
