"""conv1d, conv3d and their transposes (functional and modules) against PyTorch, forward and backward."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn

torch = pytest.importorskip("torch")
R = np.random.default_rng(5)


def rand(*shape):
    return R.uniform(-1.0, 1.0, shape)


def _compare(mg_fn, torch_fn, arrays, rtol=1e-9, atol=1e-9):
    """Forward and the gradient of sum(out * probe) for every input, in float64."""
    ours = [mg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = mg_fn(*ours), torch_fn(*theirs)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=rtol, atol=atol)
    probe = rand(*expected.shape)
    (out * mg.tensor(probe)).sum().backward()
    (expected * torch.tensor(probe)).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=atol)


CONV1D = {
    "plain": ((2, 4, 9), (3, 4, 3), True, {}),
    "stride_pad_dilation": ((2, 4, 11), (6, 2, 3), True, dict(stride=2, padding=2, dilation=2, groups=2)),
    "same": ((1, 2, 8), (3, 2, 4), False, dict(padding="same", dilation=2)),
    "valid_unbatched": ((2, 7), (3, 2, 2), True, dict(padding="valid")),
}


@pytest.mark.parametrize("name", sorted(CONV1D))
def test_conv1d(name):
    x, w, bias, kwargs = CONV1D[name]
    arrays = [rand(*x), rand(*w)] + ([rand(w[0])] if bias else [])
    _compare(lambda *a: F.conv1d(*a, **kwargs), lambda *a: torch.nn.functional.conv1d(*a, **kwargs), arrays)


CONV3D = {
    "plain": ((2, 3, 4, 5, 4), (2, 3, 2, 3, 2), True, {}),
    "stride_pad_dilation_groups": ((1, 4, 5, 6, 5), (4, 2, 2, 2, 3), True,
                                   dict(stride=(2, 1, 2), padding=(1, 2, 0), dilation=(1, 2, 1), groups=2)),
    "same": ((1, 2, 4, 4, 5), (2, 2, 3, 2, 3), False, dict(padding="same")),
    "unbatched": ((2, 3, 4, 3), (1, 2, 2, 2, 2), True, dict(padding=1)),
}


@pytest.mark.parametrize("name", sorted(CONV3D))
def test_conv3d(name):
    x, w, bias, kwargs = CONV3D[name]
    arrays = [rand(*x), rand(*w)] + ([rand(w[0])] if bias else [])
    _compare(lambda *a: F.conv3d(*a, **kwargs), lambda *a: torch.nn.functional.conv3d(*a, **kwargs), arrays)


TRANSPOSED = {
    "1d": (F.conv_transpose1d, "conv_transpose1d", (2, 4, 5), (4, 3, 3),
           dict(stride=2, padding=1, output_padding=1)),
    "1d_groups_dilation": (F.conv_transpose1d, "conv_transpose1d", (1, 4, 6), (4, 2, 2),
                           dict(stride=3, groups=2, dilation=2)),
    "3d": (F.conv_transpose3d, "conv_transpose3d", (1, 2, 3, 2, 3), (2, 3, 2, 3, 2),
           dict(stride=(2, 1, 2), padding=(1, 0, 0), output_padding=(1, 0, 0))),
    "3d_groups_dilation": (F.conv_transpose3d, "conv_transpose3d", (2, 4, 2, 3, 2), (4, 1, 2, 2, 2),
                           dict(stride=2, groups=2, dilation=(1, 2, 1))),
}


@pytest.mark.parametrize("name", sorted(TRANSPOSED))
def test_conv_transpose(name):
    fn, torch_name, x, w, kwargs = TRANSPOSED[name]
    cout = w[1] * kwargs.get("groups", 1)
    arrays = [rand(*x), rand(*w), rand(cout)]
    _compare(lambda *a: fn(*a, **kwargs), lambda *a: getattr(torch.nn.functional, torch_name)(*a, **kwargs),
             arrays)


MODULES = {
    "Conv1d": (dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, groups=2), (2, 4, 9)),
    "Conv3d": (dict(in_channels=2, out_channels=3, kernel_size=(2, 3, 2), padding="same", bias=False),
               (1, 2, 3, 4, 4)),
    "ConvTranspose1d": (dict(in_channels=2, out_channels=4, kernel_size=3, stride=2, output_padding=1),
                        (2, 2, 5)),
    "ConvTranspose3d": (dict(in_channels=2, out_channels=2, kernel_size=2, stride=2, dilation=1),
                        (1, 2, 2, 3, 2)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_torch_state_dict(name):
    kwargs, shape = MODULES[name]
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    expected_shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == expected_shapes
    ours.load_state_dict({k: mg.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    x = rand(*shape).astype(np.float32)
    np.testing.assert_allclose(ours(mg.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_conv3d_finite_differences():
    x, w = rand(1, 2, 3, 3, 3), rand(2, 2, 2, 2, 2)
    xt = mg.tensor(x, requires_grad=True)
    F.conv3d(xt, mg.tensor(w), stride=2, padding=1).sum().backward()
    eps, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        for sign in (1, -1):
            shifted = x.copy()
            shifted[i] += sign * eps
            numeric[i] += sign * F.conv3d(mg.tensor(shifted), mg.tensor(w), stride=2, padding=1).sum().item()
    np.testing.assert_allclose(xt.grad.numpy(), numeric / (2 * eps), rtol=1e-6, atol=1e-8)


INTERPOLATE = {
    "linear_size": ((2, 3, 5), "linear", dict(size=8)),
    "linear_align_corners": ((2, 3, 5), "linear", dict(scale_factor=0.6, align_corners=True)),
    "bicubic_size": ((1, 2, 4, 5), "bicubic", dict(size=(7, 3))),
    "bicubic_align_corners": ((1, 2, 4, 5), "bicubic", dict(scale_factor=2.5, align_corners=True)),
    "bicubic_downscale": ((1, 2, 6, 5), "bicubic", dict(scale_factor=0.7)),
    "trilinear_size": ((1, 2, 3, 4, 3), "trilinear", dict(size=(5, 6, 2))),
    "trilinear_align_corners": ((1, 2, 3, 4, 3), "trilinear", dict(scale_factor=1.7, align_corners=True)),
    "nearest_exact_1d": ((1, 2, 5), "nearest-exact", dict(size=8)),
    "nearest_exact_2d": ((1, 2, 5, 7), "nearest-exact", dict(scale_factor=0.6)),
    "nearest_3d": ((1, 2, 3, 4, 3), "nearest", dict(scale_factor=(2, 1.5, 3))),
    "bilinear_recompute": ((1, 2, 4, 5), "bilinear", dict(scale_factor=1.7, recompute_scale_factor=True)),
}


@pytest.mark.parametrize("name", sorted(INTERPOLATE))
def test_interpolate(name):
    shape, mode, kwargs = INTERPOLATE[name]
    _compare(lambda x: F.interpolate(x, mode=mode, **kwargs),
             lambda x: torch.nn.functional.interpolate(x, mode=mode, **kwargs), [rand(*shape)])


def test_nearest_gradient_follows_the_forward():
    """At a fractional scale PyTorch's nearest backward (scale 2.2: [3, 7, 11, 15]) does not match its
    own forward; ours is the forward's exact gradient: each input sums the outputs that copy it."""
    x = mg.tensor(np.arange(4.0).reshape(1, 1, 4), requires_grad=True)
    y = F.interpolate(x, scale_factor=2.2, mode="nearest")
    np.testing.assert_array_equal(y.numpy().ravel(), [0, 0, 0, 1, 1, 2, 2, 3])
    (y * mg.tensor(np.arange(1.0, 9.0).reshape(1, 1, 8))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy().ravel(), [6, 9, 13, 8])


def test_upsample_module_and_bad_modes():
    x = rand(1, 2, 3, 4)
    ours = nn.Upsample(scale_factor=2, mode="bicubic", align_corners=False)
    theirs = torch.nn.Upsample(scale_factor=2, mode="bicubic", align_corners=False)
    np.testing.assert_allclose(ours(mg.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy(),
                               rtol=1e-9, atol=1e-9)
    with pytest.raises(mg.ShapeError):
        F.interpolate(mg.tensor(x), size=4, mode="linear")
    with pytest.raises(mg.ArgumentError):
        F.interpolate(mg.tensor(x), size=4, mode="nearest-exact", align_corners=True)


CONV_OPTIONS = {
    "defaults": {},
    "tuples": dict(stride=2, padding=1, dilation=2, groups=2, bias=False),
    "same": dict(padding="same", dilation=2),
    "valid": dict(padding="valid", groups=2),
    "reflect": dict(padding=1, padding_mode="reflect"),
    "replicate_same": dict(padding="same", padding_mode="replicate", dilation=2),
    "circular": dict(padding=2, stride=2, padding_mode="circular", bias=False),
}


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(CONV_OPTIONS))
def test_conv_of_every_rank_matches_torch(dims, name):
    """Conv1d, Conv2d and Conv3d share one base: PyTorch's repr, state_dict, padding strings and
    padding modes, forward and backward with PyTorch's weights."""
    options = CONV_OPTIONS[name]
    kernel = (3, 2, 3)[:dims] if options.get("padding") == "same" else 3
    cls = f"Conv{dims}d"
    ours, theirs = getattr(nn, cls)(4, 6, kernel, **options), getattr(torch.nn, cls)(4, 6, kernel, **options)
    assert repr(ours) == repr(theirs)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    theirs = theirs.double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    ours = ours.double()
    _compare(ours, theirs, [rand(2, 4, *(7, 6, 5)[:dims])])     # through the same probe: the parameters'
    theirs_by_name = dict(theirs.named_parameters())            # gradients are comparable too
    for key, parameter in ours.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(), theirs_by_name[key].grad.numpy(), rtol=1e-9,
                                   atol=1e-9, err_msg=key)


TRANSPOSED_OPTIONS = {
    "defaults": {},
    "everything": dict(stride=2, padding=1, output_padding=1, groups=2, bias=False, dilation=2),
}


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(TRANSPOSED_OPTIONS))
def test_conv_transpose_of_every_rank_matches_torch(dims, name):
    """ConvTranspose1d-3d on the same base: repr, state_dict and forward as PyTorch's."""
    options, cls = TRANSPOSED_OPTIONS[name], f"ConvTranspose{dims}d"
    ours, theirs = getattr(nn, cls)(4, 6, 3, **options), getattr(torch.nn, cls)(4, 6, 3, **options)
    assert repr(ours) == repr(theirs)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = rand(2, 4, *(4, 3, 3)[:dims]).astype(np.float32)
    np.testing.assert_allclose(ours(mg.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, shape, fan_in", [
    ("Conv1d", (6, 2, 3), 6), ("Conv2d", (6, 2, 3, 3), 18), ("Conv3d", (6, 2, 3, 3, 3), 54),
    ("ConvTranspose1d", (4, 3, 3), 9), ("ConvTranspose2d", (4, 3, 3, 3), 27),
    ("ConvTranspose3d", (4, 3, 3, 3, 3), 81),
])
def test_default_initialisation_is_torchs_kaiming_uniform(cls, shape, fan_in):
    """uniform within 1/sqrt(fan_in), weight and bias, fan_in from the weight's second axis (so
    out_channels/groups for a transposed convolution); reset_parameters draws again."""
    layer = getattr(nn, cls)(4, 6, 3, groups=2)
    assert tuple(layer.weight.shape) == shape and tuple(layer.bias.shape) == (6,)
    bound = 1 / np.sqrt(fan_in)
    for values in (layer.weight.numpy(), layer.bias.numpy()):
        assert np.abs(values).max() <= bound and np.abs(values).max() > bound / 2
    before = layer.weight.numpy().copy()
    layer.reset_parameters()
    assert not np.array_equal(before, layer.weight.numpy()) and np.abs(layer.weight.numpy()).max() <= bound


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Conv2d(3, 4, 3, groups=2), "groups=2"),
    (lambda: nn.ConvTranspose2d(3, 4, 3, groups=2), "groups=2"),
    (lambda: nn.Conv1d(4, 4, 3, groups=0), "groups=0"),
    (lambda: nn.Conv2d(2, 4, 3, padding="full"), "'full'"),
    (lambda: nn.Conv3d(2, 4, 3, padding="same", stride=2), "stride 1"),
    (lambda: nn.Conv2d(2, 4, 3, padding_mode="mirror"), "'mirror'"),
    (lambda: nn.ConvTranspose2d(2, 4, 3, padding_mode="reflect"), "'reflect'"),
    (lambda: nn.ConvTranspose1d(2, 4, 3, padding="same"), "'same'"),
])
def test_conv_constructor_errors_are_value_errors(make, match):
    """What PyTorch refuses with a ValueError (or fails on later), refused when the layer is built."""
    with pytest.raises(ValueError, match=match):
        make()


def test_kernel_size_must_have_the_rank():
    with pytest.raises(mg.ShapeError, match="kernel_size must be an int or 2 ints"):
        nn.Conv2d(2, 4, (3, 3, 3))
