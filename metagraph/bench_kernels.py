"""Kernel workloads of the benchmark suite: single operators at the shapes networks run them,
metagraph beside PyTorch on the same arrays (metagraph.bench wires them in).

K1a-K1e  float32 matmul at 64^3, 256^3, 1000^3 (an odd size: no tile divides it), 2048^3 and
         4096x64 @ 64x4096 (a short inner dimension, a large output); GFLOP/s. K1d also times
         numpy's sgemm in the same rounds: the machine's roof is the best of PyTorch's and numpy's
         figures there, and the row gives metagraph's as a fraction of it.
K2f, K2b 3x3 convolution, (8, 64, 56, 56) -> 64 channels: forward; forward and backward (the
         gradients of the input and of the weight, counted as 3x the forward's FLOPs).
K3a, K3b 1x1 convolution (8, 256, 56, 56) -> 64 channels; 3x3 depthwise convolution of
         (8, 128, 56, 56), groups = channels = 128; forward.
K4       LayerNorm over the last dimension of 8192x1024, with weight and bias; GB/s of the input
         read and the output written.
Every call reads its results back to numpy, so that the work is complete.
"""
import numpy as np

import metagraph as mg
import metagraph.nn.functional as F


def random_array(*shape, seed=0):
    """Standard-normal float32 data of `shape`, the same in every run."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def matmul(m, k, n, roof=False):
    """A workload: (m x k) @ (k x n) in GFLOP/s; with roof, numpy's sgemm is timed beside it."""
    def workload(torch):
        a, b = random_array(m, k), random_array(k, n, seed=1)
        ma, mb = mg.tensor(a), mg.tensor(b)
        theirs = None
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            theirs = lambda: (ta @ tb).numpy()  # noqa: E731
        references = {"numpy": lambda: a @ b} if roof else {}
        return (lambda: (ma @ mb).numpy()), theirs, "GFLOP/s", 2 * m * k * n, references
    return workload


def conv(batch, channels, out, size, kernel, groups=1, backward=False, stride=1):
    """A workload: conv2d of (batch, channels, size, size) to `out` channels, padded by kernel // 2
    (a stride-1 conv keeps the size), in GFLOP/s; with backward, also the gradients of the input and
    the weight for a random output gradient (counted as 3x the forward's FLOPs)."""
    padding = kernel // 2
    side = (size + 2 * padding - kernel) // stride + 1
    flops = 2 * batch * out * side * side * (channels // groups) * kernel * kernel
    options = dict(padding=padding, groups=groups, stride=stride)

    def workload(torch):
        x = random_array(batch, channels, size, size)
        w = random_array(out, channels // groups, kernel, kernel, seed=1)
        if backward:
            ours, theirs = _conv_backward(torch, x, w, options)
            return ours, theirs, "GFLOP/s", 3 * flops
        mx, mw = mg.tensor(x), mg.tensor(w)
        theirs = None
        if torch:
            tx, tw = torch.from_numpy(x), torch.from_numpy(w)
            theirs = lambda: torch.nn.functional.conv2d(tx, tw, **options).numpy()  # noqa: E731
        return (lambda: F.conv2d(mx, mw, **options).numpy()), theirs, "GFLOP/s", flops
    return workload


def _conv_backward(torch, x, w, options):
    """(metagraph fn, torch fn or None): a forward and backward pass each, returning the output and
    the input's and the weight's gradients as numpy arrays (the output too: nothing else reads it,
    and a lazy graph would otherwise skip the forward pass)."""
    mx, mw = mg.tensor(x, requires_grad=True), mg.tensor(w, requires_grad=True)
    with mg.no_grad():
        shape = F.conv2d(mx, mw, **options).shape
    gradient = random_array(*shape, seed=2)
    mgrad = mg.tensor(gradient)

    def ours():
        mx.grad, mw.grad = None, None
        out = F.conv2d(mx, mw, **options)
        out.backward(mgrad)
        mg.sync(out, mx.grad, mw.grad)
        return out.numpy(), mx.grad.numpy(), mw.grad.numpy()
    if not torch:
        return ours, None
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    tgrad = torch.from_numpy(gradient)

    def theirs():
        tx.grad, tw.grad = None, None
        out = torch.nn.functional.conv2d(tx, tw, **options)
        out.backward(tgrad)
        return out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()
    return ours, theirs


def layer_norm(rows, width):
    """A workload: layer_norm over the last dimension of (rows, width), with weight and bias, in GB/s
    of the input read and the output written."""
    def workload(torch):
        x, weight, bias = random_array(rows, width), random_array(width, seed=1), random_array(width, seed=2)
        mx, mw, mb = mg.tensor(x), mg.tensor(weight), mg.tensor(bias)
        theirs = None
        if torch:
            tx, tw, tb = torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)
            theirs = lambda: torch.nn.functional.layer_norm(tx, (width,), tw, tb).numpy()  # noqa: E731
        return (lambda: F.layer_norm(mx, (width,), mw, mb).numpy()), theirs, "GB/s", 2 * x.nbytes
    return workload


WORKLOADS = {
    "K1a": ("matmul 64^3", matmul(64, 64, 64)),
    "K1b": ("matmul 256^3", matmul(256, 256, 256)),
    "K1c": ("matmul 1000^3 (odd size)", matmul(1000, 1000, 1000)),
    "K1d": ("matmul 2048^3; roof = max(PyTorch, numpy) here", matmul(2048, 2048, 2048, roof=True)),
    "K1e": ("matmul 4096x64 @ 64x4096", matmul(4096, 64, 4096)),
    "K2f": ("conv2d 3x3, (8,64,56,56) -> 64, forward", conv(8, 64, 64, 56, 3)),
    "K2b": ("conv2d 3x3, (8,64,56,56) -> 64, forward+backward", conv(8, 64, 64, 56, 3, backward=True)),
    "K2s": ("conv2d 3x3 stride 2, (32,64,32,32) -> 128, forward+backward",
            conv(32, 64, 128, 32, 3, backward=True, stride=2)),
    "K3a": ("conv2d 1x1, (8,256,56,56) -> 64, forward", conv(8, 256, 64, 56, 1)),
    "K3b": ("depthwise conv2d 3x3, (8,128,56,56), groups 128", conv(8, 128, 128, 56, 3, groups=128)),
    "K4": ("LayerNorm 8192x1024 forward", layer_norm(8192, 1024)),
}
