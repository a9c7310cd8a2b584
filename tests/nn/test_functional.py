"""nn.functional composites against plain numpy references; gradients by finite differences."""

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from tests import reference as ref
from tests.helpers import Case, case_tests, check_forward, check_grad

R = np.random.default_rng(21)


def f(*shape, low=-1.0, high=1.0):
    return R.uniform(low, high, shape)


X = f(2, 4, 6, 5)
W = f(3, 4, 3, 2)
WG = f(4, 2, 3, 3)  # groups=2: 4 output channels, 2 input channels each
B = f(3)
LOGITS = f(5, 4, low=-3, high=3)
TARGET = np.array([0, 3, 1, 2, 3])
DISTINCT = R.permutation(2 * 4 * 6 * 5).reshape(2, 4, 6, 5) / 10.0  # no ties for max pooling

CASES = {
    "linear": Case(F.linear, lambda x, w, b: x @ w.T + b, f(4, 5), f(3, 5), B),
    "linear_no_bias": Case(F.linear, lambda x, w: x @ w.T, f(2, 4, 5), f(3, 5)),
    "conv2d": Case(F.conv2d, ref.conv2d, X, W, B),
    "conv2d_stride_pad": Case(
        lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        lambda x, w: ref.conv2d(x, w, stride=2, padding=1),
        X,
        W,
    ),
    "conv2d_dilation_groups": Case(
        lambda x, w: F.conv2d(x, w, padding=(2, 1), dilation=(2, 1), groups=2),
        lambda x, w: ref.conv2d(x, w, padding=(2, 1), dilation=(2, 1), groups=2),
        X,
        WG,
    ),
    # taps that read only padding are dropped (ops/conv.py): their weight gradient is zero
    "conv2d_1x1_plane": Case(lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda x, w, b: ref.conv2d(
        x, w, b, padding=1), f(2, 3, 1, 1), f(4, 3, 3, 3), f(4)),
    "conv2d_2x2_to_1x1_stride_2": Case(lambda x, w: F.conv2d(x, w, stride=2, padding=1),
                                       lambda x, w: ref.conv2d(x, w, stride=2, padding=1),
                                       f(2, 3, 2, 2), f(4, 3, 3, 3)),
    "conv2d_1x3_plane_5x5_dilated_groups": Case(
        lambda x, w: F.conv2d(x, w, padding=(2, 4), dilation=(1, 2), groups=2),
        lambda x, w: ref.conv2d(x, w, padding=(2, 4), dilation=(1, 2), groups=2),
        f(1, 4, 1, 3),
        f(4, 2, 5, 5),
    ),
    "conv2d_unbatched": Case(
        lambda x, w: F.conv2d(x, w, padding=1), lambda x, w: ref.conv2d(x[None], w, padding=1)[0], X[0], W
    ),
    "conv_transpose2d": Case(
        lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
        lambda x, w: ref.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
        X,
        f(4, 3, 3, 3),
    ),
    "conv_transpose2d_groups": Case(
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=3, groups=2, dilation=2),
        lambda x, w, b: ref.conv_transpose2d(x, w, b, stride=3, groups=2, dilation=2),
        X,
        f(4, 2, 2, 3),
        f(4),
    ),
    "max_pool2d": Case(lambda x: F.max_pool2d(x, 2), lambda x: ref.pool2d(x, 2, 2, 0, "max", None), DISTINCT),
    "max_pool2d_pad_ceil": Case(
        lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
        lambda x: ref.pool2d(x, 3, 2, 1, "max", None, ceil_mode=True),
        DISTINCT,
    ),
    "avg_pool2d": Case(lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: ref.pool2d(x, 3, 2, 1, "avg", 0), X),
    "avg_pool2d_ceil_no_pad_count": Case(
        lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda x: ref.pool2d(x, 2, 2, 1, "avg", 0, ceil_mode=True, count_include_pad=False),
        X,
    ),
    "avg_pool2d_ceil_pad_count": Case(
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
        lambda x: ref.pool2d(x, 3, 2, 1, "avg", 0, ceil_mode=True),
        X,
    ),
    "adaptive_avg_pool2d": Case(
        lambda x: F.adaptive_avg_pool2d(x, (4, 3)), lambda x: ref.adaptive_avg_pool2d(x, (4, 3)), X
    ),
    "adaptive_avg_pool2d_global": Case(
        lambda x: F.adaptive_avg_pool2d(x, 1), lambda x: x.mean((2, 3), keepdims=True), X
    ),
    "interpolate_nearest": Case(
        lambda x: F.interpolate(x, size=(9, 3)), lambda x: ref.interpolate_nearest(x, (9, 3)), X
    ),
    "interpolate_nearest_scale": Case(
        lambda x: F.interpolate(x, scale_factor=2), lambda x: x.repeat(2, 2).repeat(2, 3), X
    ),
    "interpolate_bilinear": Case(
        lambda x: F.interpolate(x, size=(9, 4), mode="bilinear"),
        lambda x: ref.interpolate_bilinear(x, (9, 4)),
        X,
    ),
    "interpolate_bilinear_corners": Case(
        lambda x: F.interpolate(x, size=(3, 8), mode="bilinear", align_corners=True),
        lambda x: ref.interpolate_bilinear(x, (3, 8), align_corners=True),
        X,
    ),
    "softmax": Case(lambda x: F.softmax(x, 1), lambda x: ref.softmax(x, 1), LOGITS * 10),
    "softmax_method_dim0": Case(lambda x: F.softmax(x, dim=0), lambda x: ref.softmax(x, 0), LOGITS),
    "log_softmax": Case(lambda x: F.log_softmax(x, -1), lambda x: ref.log_softmax(x, -1), LOGITS * 10),
    "cross_entropy": Case(lambda x, t: F.cross_entropy(x, t), ref.cross_entropy, LOGITS, TARGET),
    "cross_entropy_options": Case(
        lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=1, label_smoothing=0.2),
        lambda x, t, w: ref.cross_entropy(x, t, w, ignore_index=1, label_smoothing=0.2),
        LOGITS,
        TARGET,
        f(4, low=0.5, high=2),
    ),
    "cross_entropy_sum_none": Case(
        lambda x, t: (F.cross_entropy(x, t, reduction="sum"), F.cross_entropy(x, t, reduction="none")),
        lambda x, t: (ref.cross_entropy(x, t, reduction="sum"), ref.cross_entropy(x, t, reduction="none")),
        LOGITS,
        TARGET,
    ),
    "cross_entropy_probabilities": Case(
        lambda x, p: F.cross_entropy(x, p),
        lambda x, p: np.array(-(ref.log_softmax(x, 1) * p).sum(1).mean()),
        LOGITS,
        ref.softmax(f(5, 4), 1),
    ),
    "cross_entropy_spatial": Case(
        lambda x, t: F.cross_entropy(x, t),
        lambda x, t: ref.cross_entropy(x.transpose(0, 2, 1).reshape(-1, 4), t.reshape(-1)),
        f(2, 4, 3),
        R.integers(0, 4, (2, 3)),
    ),
    "nll_loss": Case(
        lambda x, t: F.nll_loss(x, t), lambda x, t: np.array(-x[np.arange(5), t].mean()), LOGITS, TARGET
    ),
    "mse_loss": Case(F.mse_loss, lambda a, b: np.array(((a - b) ** 2).mean()), f(3, 4), f(3, 4)),
    "l1_loss_sum": Case(
        lambda a, b: F.l1_loss(a, b, reduction="sum"),
        lambda a, b: np.array(np.abs(a - b).sum()),
        f(3, 4),
        f(3, 4) + 3,
    ),
    "bce_with_logits": Case(
        F.binary_cross_entropy_with_logits,
        lambda x, y: np.array(np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))),
        f(3, 4, low=-30, high=30),
        R.random((3, 4)),
    ),
    "bce_with_logits_pos_weight": Case(
        lambda x, y, p: F.binary_cross_entropy_with_logits(x, y, pos_weight=p, reduction="none"),
        lambda x, y, p: -(p * y * np.log(1 / (1 + np.exp(-x))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-x)))),
        f(3, 4, low=-3, high=3),
        R.random((3, 4)),
        f(4, low=0.5, high=2),
    ),
    "binary_cross_entropy": Case(
        F.binary_cross_entropy,
        lambda p, y: np.array(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p)))),
        f(3, 4, low=0.05, high=0.95),
        R.random((3, 4)),
    ),
    "batch_norm_train": Case(
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda x, w, b: ref.batch_norm_train(x, w, b, 1e-5),
        X,
        f(4),
        f(4),
    ),
    "batch_norm_eval": Case(
        lambda x, m, v: F.batch_norm(x, m, v),
        lambda x, m, v: (x - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5),
        X,
        f(4),
        f(4, low=0.5, high=2),
    ),
    "batch_norm_1d": Case(
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda x, w, b: ref.batch_norm_train(x, w, b, 1e-5),
        f(6, 3),
        f(3),
        f(3),
    ),
    "layer_norm": Case(
        lambda x, w, b: F.layer_norm(x, (6, 5), w, b),
        lambda x, w, b: ref.layer_norm(x, 2, w, b, 1e-5),
        X,
        f(6, 5),
        f(6, 5),
    ),
    "group_norm": Case(
        lambda x: F.group_norm(x, 2),
        lambda x: ref.layer_norm(x.reshape(2, 2, -1), 1, 1.0, 0.0, 1e-5).reshape(x.shape),
        X,
    ),
    "embedding": Case(F.embedding, lambda i, w: w[i], np.array([[0, 4], [2, 2]]), f(5, 3)),
    "relu6_leaky": Case(
        lambda x: F.relu6(x * 8) + F.leaky_relu(x, 0.2),
        lambda x: np.clip(x * 8, 0, 6) + np.where(x > 0, x, 0.2 * x),
        f(3, 4),
    ),
    "dropout_eval_identity": Case(lambda x: F.dropout(x, 0.5, training=False), lambda x: x, f(3, 4)),
}


test_forward, test_float32, test_gradient = case_tests(CASES)


def test_batch_norm_updates_running_statistics_in_place():
    x = f(8, 3, 2, 2)
    mean, var = mg.zeros(3), mg.ones(3)
    F.batch_norm(mg.tensor(x), mean, var, training=True, momentum=0.1)
    batch_mean = x.mean((0, 2, 3))
    batch_var = x.var((0, 2, 3), ddof=1)
    np.testing.assert_allclose(mean.numpy(), 0.1 * batch_mean, rtol=1e-5)
    np.testing.assert_allclose(var.numpy(), 0.9 + 0.1 * batch_var, rtol=1e-5)


def test_dropout_keeps_expectation_and_zeroes_a_fraction():
    mg.manual_seed(3)
    x = mg.ones(20000)
    y = F.dropout(x, 0.25).numpy()
    assert abs((y == 0).mean() - 0.25) < 0.02
    np.testing.assert_allclose(y[y != 0], 1 / 0.75, rtol=1e-6)
    assert abs(y.mean() - 1) < 0.03


def test_embedding_padding_row_gets_no_gradient():
    w = mg.tensor(f(5, 3), requires_grad=True)
    out = F.embedding(mg.tensor([[0, 2], [2, 4]]), w, padding_idx=2)
    (g,) = mg.grad(out.sum(), [w])
    np.testing.assert_array_equal(g.numpy()[:, 0], [1, 0, 0, 0, 1])


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: F.conv2d(mg.ones(1, 3, 5, 5), mg.ones(2, 4, 3, 3)), "expects 4 input channels|does not fit"),
        (lambda: F.conv2d(mg.ones(1, 3, 2, 2), mg.ones(2, 3, 3, 3)), "larger than the padded input"),
        (lambda: F.conv2d(mg.ones(3, 5, 5), mg.ones(2, 3, 3)), "weight must be 4-D"),
        (lambda: F.cross_entropy(mg.ones(4, 3), mg.tensor([0, 1, 2])), "do not match"),
        (lambda: F.cross_entropy(mg.ones(2, 3), mg.tensor([0, 5])).item(), "out of bounds"),
        (lambda: F.max_pool2d(mg.ones(1, 1, 4, 4), 2, padding=2), "at most half"),
        (lambda: F.layer_norm(mg.ones(2, 3), (4,)), "does not match"),
        (lambda: F.interpolate(mg.ones(1, 1, 2, 2), size=3, scale_factor=2), "exactly one"),
    ],
)
def test_errors_name_the_op(bad, match):
    with pytest.raises(mg.MetagraphError, match=match):
        bad()


def test_dropout_gradient_with_a_fixed_mask():
    from metagraph.ops import loss as ops_loss
    from metagraph.tensor import Tensor

    uniform = mg.tensor(R.random((3, 4)))

    def dropped(x):
        return Tensor(ops_loss.dropout(x.node, 0.3, uniform.node))

    keep = uniform.numpy() >= 0.3
    check_forward(dropped, lambda x: np.where(keep, x / 0.7, 0.0), f(3, 4))
    check_grad(dropped, f(3, 4))


@pytest.mark.parametrize("x, w, conv, taps", [
    ((2, 3, 1, 1), (4, 3, 3, 3), dict(padding=1), (1, 1)),
    ((2, 3, 2, 2), (4, 3, 3, 3), dict(stride=2, padding=1), (2, 2)),
    ((1, 4, 1, 3), (4, 2, 5, 5), dict(padding=(2, 4), dilation=(1, 2), groups=2), (1, 3)),
    ((1, 2, 4, 4), (3, 2, 3, 3), dict(padding=1), (3, 3)),          # every tap reads the input
])
def test_conv_sums_only_taps_that_read_the_input(x, w, conv, taps):
    out = F.conv2d(mg.rand(*x), mg.rand(*w), **conv)
    assert out.node.op == "reduce" and out.node.inputs[0].shape[-2:] == taps


@pytest.mark.parametrize("size, align_corners", [((5, 7), False), ((5, 7), True), ((13, 5), False),
                                                 ((3, 2), True), ((4, 9), False), ((6, 4), False)])
def test_bilinear_resize_of_uint8_images_gives_pytorchs_bytes(size, align_corners):
    torch = pytest.importorskip("torch")
    image = np.random.default_rng(3).integers(0, 256, (2, 3, 4, 6)).astype(np.uint8)
    want = torch.nn.functional.interpolate(torch.tensor(image), size=size, mode="bilinear",
                                           align_corners=align_corners).numpy()
    got = F.interpolate(mg.tensor(image), size=size, mode="bilinear", align_corners=align_corners)
    assert got.dtype == mg.uint8
    np.testing.assert_array_equal(got.numpy(), want)


def test_bilinear_resize_of_uint8_by_a_scale_factor_gives_pytorchs_bytes():
    torch = pytest.importorskip("torch")
    image = np.random.default_rng(4).integers(0, 256, (1, 3, 7, 9)).astype(np.uint8)
    for scale in (2.0, 1.5, 0.5):
        want = torch.nn.functional.interpolate(torch.tensor(image), scale_factor=scale, mode="bilinear")
        got = F.interpolate(mg.tensor(image), scale_factor=scale, mode="bilinear")
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_an_interpolation_mode_not_implemented_is_not_implemented_error():
    with pytest.raises(NotImplementedError, match="interpolate: mode must be one of"):
        F.interpolate(mg.ones(1, 1, 2, 2), size=3, mode="area")
