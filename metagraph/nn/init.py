"""Parameter initialisation, as torch.nn.init (in place, under no_grad, from metagraph's generator)."""
import math

from metagraph import creation
from metagraph.errors import ArgumentError
from metagraph.grad import no_grad
from metagraph.nn.module import realize_on_host


def _fans(tensor):
    if tensor.ndim < 2:
        raise ArgumentError(f"fan in and fan out need at least 2 dimensions, got shape {tensor.shape}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def calculate_gain(nonlinearity, param=None):
    gains = {"linear": 1.0, "conv2d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
             "selu": 3.0 / 4}
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in gains:
        raise ArgumentError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")
    return gains[nonlinearity]


def _fill(tensor, values):
    with no_grad():
        tensor.assign(values.to(tensor.dtype))
    return realize_on_host(tensor)


def uniform_(tensor, a=0.0, b=1.0):
    return _fill(tensor, creation.rand(tensor.shape) * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0):
    return _fill(tensor, creation.randn(tensor.shape) * std + mean)


def constant_(tensor, val):
    return _fill(tensor, creation.full(tensor.shape, val, tensor.dtype))


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def _fan(tensor, mode):
    fan_in, fan_out = _fans(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / _fan(tensor, mode))
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


def xavier_uniform_(tensor, gain=1.0):
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain=1.0):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
