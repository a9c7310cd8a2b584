"""The user's side of autograd: mg.grad (Jittor habit) and the no_grad switches."""
import contextlib

from metagraph.ops import autograd
from metagraph.ops import math as m
from metagraph.ops.node import GradMode
from metagraph.tensor import Tensor, seed_gradient


def grad(output, inputs, grad_output=None, create_graph=False, retain_graph=None):
    """d(output)/d(input) for each input; an input the output does not depend on gets zeros.
    The graph is released unless retain_graph (by default create_graph), as in PyTorch."""
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    seed = seed_gradient("grad", output, grad_output)
    grads = autograd.gradients([output.node], [seed], create_graph, retain_graph, "grad") \
        if output.requires_grad else {}
    results = [Tensor(grads[t.node.id]) if t.node.id in grads else
               Tensor(m.const(0, t.shape, t.dtype)) for t in inputs]
    return results[0] if single else results


@contextlib.contextmanager
def set_grad_enabled(mode):
    """Record autograd history inside the block only if mode is true."""
    previous, GradMode.enabled = GradMode.enabled, bool(mode)
    try:
        yield
    finally:
        GradMode.enabled = previous


def no_grad():
    """A block (or decorator) in which nothing records autograd history."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)


@contextlib.contextmanager
def _unchanged():
    yield


def inference_mode(mode=True):
    """PyTorch's inference_mode, as no_grad (nothing here tracks versions): a block, a decorator
    (with or without parentheses); inference_mode(False) changes nothing."""
    if callable(mode):
        return set_grad_enabled(False)(mode)
    return set_grad_enabled(False) if mode else _unchanged()
