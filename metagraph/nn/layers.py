"""Layers with PyTorch's constructors, parameter names and default initialisation."""
import math

from metagraph import creation
from metagraph.errors import ArgumentError
from metagraph.nn import functional as F
from metagraph.nn.module import Module, Parameter


def _uniform_parameter(shape, bound):
    return Parameter(creation.rand(*shape) * (2 * bound) - bound)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform_parameter((out_features, in_features), bound)   # kaiming_uniform(a=sqrt 5)
        self.bias = _uniform_parameter((out_features,), bound) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class _BatchNorm(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(creation.ones(num_features)) if affine else None
        self.bias = Parameter(creation.zeros(num_features)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", creation.zeros(num_features))
            self.register_buffer("running_var", creation.ones(num_features))
            self.register_buffer("num_batches_tracked", creation.tensor(0))

    def _check(self, x):
        pass

    def forward(self, x):
        self._check(x)
        use_batch = self.training or not self.track_running_stats
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            if momentum is None:            # a cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked.item())
        return F.batch_norm(x, self.running_mean if self.track_running_stats else None,
                            self.running_var if self.track_running_stats else None, self.weight, self.bias,
                            use_batch, momentum if momentum is not None else 0.0, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm1d(_BatchNorm):
    def _check(self, x):
        if x.ndim not in (2, 3):
            raise ArgumentError(f"BatchNorm1d expects 2-D or 3-D input, got shape {x.shape}")


class BatchNorm2d(_BatchNorm):
    def _check(self, x):
        if x.ndim != 4:
            raise ArgumentError(f"BatchNorm2d expects 4-D input, got shape {x.shape}")


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else \
            tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(creation.ones(*self.normalized_shape)) if elementwise_affine else None
        self.bias = Parameter(creation.zeros(*self.normalized_shape)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(creation.ones(num_channels)) if affine else None
        self.bias = Parameter(creation.zeros(num_channels)) if affine else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ArgumentError(f"Dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(creation.randn(num_embeddings, embedding_dim))
        if padding_idx is not None:
            with_zero = self.weight.numpy().copy()
            with_zero[padding_idx] = 0
            self.weight.assign(creation.tensor(with_zero))

    def forward(self, x):
        return F.embedding(x, self.weight, self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


def _activation(name, fn, **defaults):
    def __init__(self, *args, inplace=False, **kwargs):
        Module.__init__(self)
        self.options = dict(defaults)
        self.options.update(zip(list(defaults), args))
        self.options.update(kwargs)

    def forward(self, x):
        return fn(x, **self.options)

    def extra_repr(self):
        return ", ".join(f"{k}={v}" for k, v in self.options.items())
    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr})


ReLU = _activation("ReLU", lambda x: F.relu(x))
LeakyReLU = _activation("LeakyReLU", F.leaky_relu, negative_slope=0.01)
GELU = _activation("GELU", F.gelu, approximate="none")
SiLU = _activation("SiLU", lambda x: F.silu(x))
Sigmoid = _activation("Sigmoid", lambda x: F.sigmoid(x))
Tanh = _activation("Tanh", lambda x: F.tanh(x))
Softmax = _activation("Softmax", F.softmax, dim=None)
LogSoftmax = _activation("LogSoftmax", F.log_softmax, dim=None)
ELU = _activation("ELU", F.elu, alpha=1.0)
SELU = _activation("SELU", lambda x: F.selu(x))
CELU = _activation("CELU", F.celu, alpha=1.0)
Mish = _activation("Mish", lambda x: F.mish(x))
Hardswish = _activation("Hardswish", lambda x: F.hardswish(x))
Hardsigmoid = _activation("Hardsigmoid", lambda x: F.hardsigmoid(x))
Softplus = _activation("Softplus", F.softplus, beta=1.0, threshold=20.0)


class Hardtanh(Module):
    """x limited to [min_val, max_val] (F.hardtanh); inplace is accepted and ignored, as the other
    activations' is."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if max_val <= min_val:
            raise ArgumentError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    """Hardtanh(0, 6), as PyTorch's."""

    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0)

    def extra_repr(self):
        return ""


class PReLU(Module):
    """x above 0, a learned slope times x below: one slope, or one per channel (dimension 1)."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(creation.full((num_parameters,), float(init)))

    def forward(self, x):
        return F.prelu(x, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, "
                f"padding={self.padding}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], dict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __getitem__(self, index):
        items = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*items[index])
        return items[index]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def __getitem__(self, index):
        items = list(self._modules.values())
        return ModuleList(items[index]) if isinstance(index, slice) else items[index]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        for name, module in (modules or {}).items():
            self.add_module(name, module)

    def __getitem__(self, name):
        return self._modules[name]

    def __setitem__(self, name, module):
        self.add_module(name, module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()


def _loss(name, fn, **defaults):
    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        self.options = dict(defaults)
        self.options.update(zip(list(defaults), args))
        self.options.update(kwargs)
        for key in ("weight", "pos_weight"):
            if self.options.get(key) is not None:
                self.register_buffer(key, self.options.pop(key))

    def forward(self, input, target):
        extra = {key: self._buffers[key] for key in ("weight", "pos_weight") if key in self._buffers}
        return fn(input, target, **self.options, **extra)
    return type(name, (Module,), {"__init__": __init__, "forward": forward})


CrossEntropyLoss = _loss("CrossEntropyLoss", F.cross_entropy, weight=None, ignore_index=-100,
                         reduction="mean", label_smoothing=0.0)
NLLLoss = _loss("NLLLoss", F.nll_loss, weight=None, ignore_index=-100, reduction="mean")
MSELoss = _loss("MSELoss", F.mse_loss, reduction="mean")
L1Loss = _loss("L1Loss", F.l1_loss, reduction="mean")
BCEWithLogitsLoss = _loss("BCEWithLogitsLoss", F.binary_cross_entropy_with_logits, weight=None,
                          reduction="mean", pos_weight=None)
