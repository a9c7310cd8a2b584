"""Conv1d, Conv3d, ConvTranspose1d, ConvTranspose3d and Upsample with PyTorch's constructors,
parameter names and default initialisation (kaiming_uniform(a=sqrt 5), as Conv2d in layers.py)."""
import math

from metagraph.errors import ArgumentError
from metagraph.nn import functional as F
from metagraph.nn.layers import _uniform_parameter
from metagraph.nn.module import Module
from metagraph.ops.conv_nd import ntuple


class _ConvNd(Module):
    """A convolution over `dims` spatial dimensions; `transposed` swaps the weight's first two axes."""
    dims, transposed = None, False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, output_padding=0):
        super().__init__()
        name, n = type(self).__name__, self.dims
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(f"{name}: channels {in_channels}->{out_channels} must divide by "
                                f"groups={groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = ntuple(name, kernel_size, n, "kernel_size")
        self.stride, self.dilation = ntuple(name, stride, n, "stride"), ntuple(name, dilation, n, "dilation")
        self.padding = padding if isinstance(padding, str) else ntuple(name, padding, n, "padding")
        self.output_padding = ntuple(name, output_padding, n, "output_padding")
        if self.transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
            fan_in = out_channels // groups * math.prod(self.kernel_size)
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
            fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1 / math.sqrt(fan_in)
        self.weight = _uniform_parameter(shape, bound)
        self.bias = _uniform_parameter((out_channels,), bound) if bias else None

    def extra_repr(self):
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
            f"stride={self.stride}"
        if self.padding not in ((0,) * self.dims, "valid"):
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self.dims:
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    dims = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv3d(_ConvNd):
    dims = 3

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, x):
        return F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose1d(_ConvNd):
    dims, transposed = 1, True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         output_padding)

    def forward(self, x):
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class ConvTranspose3d(_ConvNd):
    dims, transposed = 3, True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         output_padding)

    def forward(self, x):
        return F.conv_transpose3d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


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
