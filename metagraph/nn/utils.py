"""Gradient clipping, as torch.nn.utils. The gradients are scaled in place and stay lazy: the norm and
the scaling are computed with the optimizer's step, at its realisation, with no sync of their own
(unless error_if_nonfinite asks for one: it must read the norm).

`foreach` is accepted for PyTorch's signature and changes nothing: every gradient's update already
joins one graph, which the backend fuses."""
import math
import types
import warnings

from metagraph import creation
from metagraph.errors import ArgumentError, MetagraphError
from metagraph.grad import no_grad
from metagraph.ops import movement as mv
from metagraph.tensor import Tensor


def _tensor_list(op, tensors):
    """A tensor or an iterable of tensors, as a list."""
    if isinstance(tensors, Tensor):
        return [tensors]
    try:
        tensors = list(tensors)
    except TypeError:
        raise TypeError(f"{op}: expected a tensor or an iterable of tensors, got "
                        f"{type(tensors).__name__}") from None
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{op}: expected tensors, got an element of type {type(tensor).__name__}")
    return tensors


def _norm_order(op, norm_type):
    try:
        return float(norm_type)
    except (TypeError, ValueError):
        raise ArgumentError(f"{op}: norm_type must be a number or 'inf', got {norm_type!r}") from None


def _vector_norm(x, order):
    """torch.linalg.vector_norm over all elements of x."""
    if order == math.inf:
        return x.abs().amax()
    if order == -math.inf:
        return x.abs().amin()
    if order == 0:
        return (x != 0).sum().to(x.dtype)
    if order == 1:
        return x.abs().sum()
    if order == 2:
        return (x * x).sum().sqrt()
    return (x.abs() ** order).sum() ** (1.0 / order)


def _total_norm(op, tensors, order, error_if_nonfinite):
    if not tensors:
        return creation.tensor(0.0)
    with no_grad():
        norms = [_vector_norm(tensor, order) for tensor in tensors]
        total = _vector_norm(Tensor(mv.stack([norm.node for norm in norms])), order)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise MetagraphError(f"{op}: the total norm of order {order} of the gradients is non-finite, "
                             "so it cannot be clipped; pass error_if_nonfinite=False to scale the "
                             "gradients by it anyway")
    return total


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the tensors' norms (the norm of all their elements as one vector), a 0-d tensor;
    0.0 for no tensors. error_if_nonfinite raises on a NaN or infinite norm (a sync)."""
    return _total_norm("get_total_norm", _tensor_list("get_total_norm", tensors),
                       _norm_order("get_total_norm", norm_type), error_if_nonfinite)


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the parameters' gradients in place by min(1, max_norm / (total_norm + 1e-6))."""
    grads = [p.grad for p in _tensor_list("clip_grads_with_norm_", parameters) if p.grad is not None]
    if not grads:
        return
    if not isinstance(total_norm, Tensor):
        total_norm = creation.tensor(float(total_norm))
    with no_grad():
        scale = (float(max_norm) / (total_norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients of `parameters` in place so that their total norm is at most max_norm;
    returns the total norm before clipping, a 0-d tensor (norm_type may be inf)."""
    generator = isinstance(parameters, types.GeneratorType)
    parameters = _tensor_list("clip_grad_norm_", parameters)
    if generator and not parameters:
        warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
    grads = [p.grad for p in parameters if p.grad is not None]
    order = _norm_order("clip_grad_norm_", norm_type)
    total = _total_norm("clip_grad_norm_", grads, order, error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, total)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp the gradients of `parameters` in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    with no_grad():
        for p in _tensor_list("clip_grad_value_", parameters):
            if p.grad is not None:
                p.grad.clamp_(min=-clip_value, max=clip_value)
