"""PyTorch's torch.nn.functional, on metagraph Tensors (each a composition of meta-ops). The ops on
PyTorch's CPU autocast lists cast their arguments first inside `mg.autocast`; softmax and the norms
compute a float16 or bfloat16 input in float32 and round once, as PyTorch's (amp/autocast.py)."""
from metagraph import creation, dtypes
from metagraph.amp.autocast import autocasting, cast_arguments, in_float32
from metagraph.errors import ArgumentError, DTypeError
from metagraph.ops import attention as at, conv, loss as ls, math as m, movement as mv, special as sp
from metagraph.ops import conv_nd
from metagraph.ops.node import GradMode
from metagraph.tensor import Tensor, lift

relu, gelu, silu, softplus = lift(m.relu), lift(m.gelu), lift(m.silu), lift(m.softplus)
sigmoid, tanh = lift(m.sigmoid), lift(m.tanh)
linear = lift(autocasting("linear", ls.linear))
conv2d = lift(autocasting("conv2d", conv.conv2d))
conv_transpose2d = lift(autocasting("conv_transpose2d", conv.conv_transpose2d))
conv1d = lift(autocasting("conv1d", conv_nd.conv1d))
conv_transpose1d = lift(autocasting("conv_transpose1d", conv_nd.conv_transpose1d))
conv3d = lift(autocasting("conv3d", conv_nd.conv3d))
conv_transpose3d = lift(autocasting("conv_transpose3d", conv_nd.conv_transpose3d))
max_pool2d, avg_pool2d = lift(conv.max_pool2d), lift(conv.avg_pool2d)
adaptive_avg_pool2d, interpolate = lift(conv.adaptive_avg_pool2d), lift(conv_nd.interpolate)
softmax, log_softmax = lift(in_float32(ls.softmax)), lift(in_float32(ls.log_softmax))
cross_entropy = lift(autocasting("cross_entropy", ls.cross_entropy))
nll_loss = lift(autocasting("nll_loss", ls.nll_loss))
mse_loss, l1_loss = lift(autocasting("mse_loss", ls.mse_loss)), lift(autocasting("l1_loss", ls.l1_loss))
binary_cross_entropy_with_logits = lift(autocasting("binary_cross_entropy_with_logits",
                                                    ls.binary_cross_entropy_with_logits))
binary_cross_entropy = lift(autocasting("binary_cross_entropy", ls.binary_cross_entropy))
layer_norm, group_norm = lift(in_float32(ls.layer_norm)), lift(in_float32(ls.group_norm))
embedding = lift(ls.embedding)
pad = lift(mv.pad)
elu, selu, celu, mish = lift(sp.elu), lift(sp.selu), lift(sp.celu), lift(sp.mish)
hardswish, hardsigmoid = lift(sp.hardswish), lift(sp.hardsigmoid)
prelu = lift(autocasting("prelu", sp.prelu))
normalize = lift(sp.normalize)


def one_hot(tensor, num_classes=-1):
    """PyTorch's F.one_hot: int64 one-hot vectors (num_classes=-1 reads the maximum: a sync)."""
    import metagraph                                  # the package imports this module
    return metagraph.one_hot(tensor, num_classes)


def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    """x limited to [min_val, max_val], as PyTorch's: the values are clamp's (NaN stays NaN, a
    bound equal to x gives x), but the gradient is 0 at the bounds and beyond and passes at NaN
    (clamp's is 1 at the bounds and 0 at NaN). Integer inputs stay integers, the bounds converted
    to their dtype. inplace is accepted and ignored, as the activation modules' is."""
    if min_val > max_val:
        raise ArgumentError(f"hardtanh: min_val {min_val} cannot be greater than max_val {max_val}")
    if x.dtype == dtypes.bool_:
        raise DTypeError("hardtanh: bool inputs are not supported")
    low, high = (m.scalar_in(bound, x.dtype, "hardtanh") for bound in (min_val, max_val))
    clamped = m.clamp(x.detach().node, low, high)
    if not (x.requires_grad and GradMode.enabled):   # the value alone: clamp's (the mask cost
        # MobileNetV2's batch-1 inference 0.63 -> 0.42 of PyTorch)
        return Tensor(clamped)
    passes = m.logical_not(m.logical_or(m.le(x.node, low), m.ge(x.node, high)))     # True at NaN
    return Tensor(m.where(passes, x.node, clamped))


def relu6(x, inplace=False):
    """hardtanh(x, 0, 6), as PyTorch defines it (so the gradient is 0 at 0 and at 6)."""
    return hardtanh(x, 0.0, 6.0)


def leaky_relu(x, negative_slope=0.01):
    return Tensor(m.where(m.lt(0, x.node), x.node, x.node * negative_slope))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """softmax(query @ key^T * scale + mask) @ value, as PyTorch's (ops/attention.py); dropout
    of the weights (fresh randomness per call) only when dropout_p > 0."""
    mask = attn_mask.node if attn_mask is not None else None
    (query, key, value, mask), _ = cast_arguments("scaled_dot_product_attention",
                                                  (query.node, key.node, value.node, mask), None)
    uniform = None
    if dropout_p > 0:
        shape = at.weights_shape(query, key, mask, enable_gqa)
        uniform = creation.rand(shape, dtype=query.dtype, device=query.device or "cpu").node
    return Tensor(at.scaled_dot_product_attention(query, key, value, mask, dropout_p, is_causal, scale,
                                                  enable_gqa, uniform))


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p (fresh randomness per call) and rescale the rest."""
    if not training or p == 0:
        return x
    return Tensor(ls.dropout(x.node, p, creation.rand(x.shape, dtype=x.dtype, device=x.device).node))


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
               eps=1e-5):
    """Normalise over (N, H, W); in training the running statistics are updated in place."""
    out, new_mean, new_var = in_float32(ls.batch_norm)(
        x.node, running_mean.node if running_mean is not None else None,
        running_var.node if running_var is not None else None,
        weight.node if weight is not None else None, bias.node if bias is not None else None,
        training, momentum, eps)
    if training and running_mean is not None:
        running_mean.assign(Tensor(new_mean))
        running_var.assign(Tensor(new_var))
    return Tensor(out)
