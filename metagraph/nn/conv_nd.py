"""The convolution modules of every rank (Conv1d-3d, ConvTranspose1d-3d) on one rank-generic base,
with PyTorch's constructors, parameter names, default initialisation and repr; and Upsample."""
import math

from metagraph import creation
from metagraph.errors import ArgumentError
from metagraph.nn import functional as F, init
from metagraph.nn.module import Module, Parameter
from metagraph.ops.conv_nd import ntuple

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    """A convolution over `dims` spatial dimensions, as PyTorch's _ConvNd: kernel_size, stride,
    padding and dilation are `dims`-tuples (padding may be 'same' or 'valid'); a padding_mode other
    than 'zeros' pads the input with F.pad first. `function` is the functional form."""
    dims, transposed, function = None, False, None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", output_padding=0):
        super().__init__()
        name, n = type(self).__name__, self.dims
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ArgumentError(f"{name}: channels {in_channels}->{out_channels} must divide by "
                                f"groups={groups}, a positive integer")
        if padding_mode not in PADDING_MODES:
            raise ArgumentError(f"{name}: padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = ntuple(name, kernel_size, n, "kernel_size")
        self.stride, self.dilation = ntuple(name, stride, n, "stride"), ntuple(name, dilation, n, "dilation")
        self.padding = padding if isinstance(padding, str) else ntuple(name, padding, n, "padding")
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ArgumentError(f"{name}: padding must be 'same', 'valid' or ints, got {padding!r}")
        if padding == "same" and self.stride != (1,) * n:
            raise ArgumentError(f"{name}: padding='same' needs stride 1, got stride={self.stride}")
        self.output_padding = ntuple(name, output_padding, n, "output_padding")
        self.padding_mode = padding_mode
        if self.transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(creation.empty(*shape))
        self.bias = Parameter(creation.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        """PyTorch's: kaiming_uniform_(a=sqrt 5) weights, which is uniform within 1/sqrt(fan_in),
        and biases within the same bound."""
        fan_in = self.weight.shape[1] * math.prod(self.kernel_size)
        bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        if self.padding_mode == "zeros":
            return self.function(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                 self.groups)
        x = F.pad(x, self._padding_pairs(), mode=self.padding_mode)
        return self.function(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def _padding_pairs(self):
        """The padding as F.pad takes it, (before, after) from the last dimension back; 'same' puts
        the odd element after, as PyTorch's."""
        pairs = []
        for d in reversed(range(self.dims)):
            if self.padding == "valid":
                pairs += [0, 0]
            elif self.padding == "same":
                total = self.dilation[d] * (self.kernel_size[d] - 1)
                pairs += [total // 2, total - total // 2]
            else:
                pairs += [self.padding[d], self.padding[d]]
        return pairs

    def extra_repr(self):
        """PyTorch's, field for field (a string padding is printed bare, as PyTorch prints it)."""
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
            f"stride={self.stride}"
        if self.padding != (0,) * self.dims:
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self.dims:
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class _ConvTransposeNd(_ConvNd):
    """The gradient of a convolution with respect to its input, as a layer: PyTorch's argument
    order, integer padding and padding_mode 'zeros' only."""
    transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1, padding_mode="zeros"):
        if padding_mode != "zeros" or isinstance(padding, str):
            raise ArgumentError(f"{type(self).__name__}: only integer padding and padding_mode 'zeros' are "
                                f"supported, got padding={padding!r}, padding_mode={padding_mode!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding)

    def forward(self, x):
        return self.function(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                             self.groups, self.dilation)


class Conv1d(_ConvNd):
    dims, function = 1, staticmethod(F.conv1d)


class Conv2d(_ConvNd):
    dims, function = 2, staticmethod(F.conv2d)


class Conv3d(_ConvNd):
    dims, function = 3, staticmethod(F.conv3d)


class ConvTranspose1d(_ConvTransposeNd):
    dims, function = 1, staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    dims, function = 2, staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    dims, function = 3, staticmethod(F.conv_transpose3d)


class Upsample(Module):
    """Resize by size or scale_factor with F.interpolate's modes."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)

    def extra_repr(self):
        text = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return text + f", mode={self.mode!r}"
