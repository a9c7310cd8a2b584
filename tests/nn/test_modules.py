"""nn.Module mechanics and layers against numpy references; running statistics by hand."""

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn
from tests.helpers import check_grad

R = np.random.default_rng(4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 3))

    def forward(self, x):
        return self.head(nn.functional.relu(self.bn(self.conv(x))))


def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "conv.weight",
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "head.1.weight",
        "head.1.bias",
    ]
    assert [n for n, _ in net.named_buffers()] == [
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    assert [n for n, _ in net.named_children()] == ["conv", "bn", "head"]
    assert len(list(net.modules())) == 6
    assert list(net.state_dict()) == [
        "conv.weight",
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
        "head.1.weight",
        "head.1.bias",
    ]
    assert "Conv2d(1, 2, kernel_size=(3, 3)" in repr(net) and "(head): Sequential(" in repr(net)
    assert all(p.requires_grad and p.is_leaf for p in net.parameters())


def test_train_eval_and_zero_grad():
    net = Net()
    assert net.training and net.bn.training
    net.eval()
    assert not net.bn.training
    net(mg.randn(2, 1, 4, 4)).sum().backward()
    assert net.conv.weight.grad is not None
    net.zero_grad()
    assert net.conv.weight.grad is None


def test_load_state_dict_round_trip_and_errors():
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    x = mg.randn(2, 1, 4, 4)
    a.eval(), b.eval()
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    state = a.state_dict()
    state["conv.weight"] = mg.zeros(3, 1, 3, 3)
    with pytest.raises(mg.ShapeError, match="'conv.weight' has shape"):
        b.load_state_dict(state)
    del state["conv.weight"]
    with pytest.raises(mg.MetagraphError, match=r"missing keys \['conv.weight'\]"):
        b.load_state_dict(state)
    missing, unexpected = b.load_state_dict({**a.state_dict(), "extra": mg.zeros(1)}, strict=False)
    assert unexpected == ["extra"] and missing == []


def test_load_state_dict_takes_a_one_element_vector_for_a_scalar_as_torch_does():
    """PyTorch's Module._load_from_state_dict loads a (1,) tensor into a 0-d parameter or buffer (old
    checkpoints' num_batches_tracked); any other shape for a 0-d entry is still refused."""
    torch = pytest.importorskip("torch")
    for value in (np.array([7]), mg.tensor([7])):
        bn = nn.BatchNorm1d(2)
        bn.load_state_dict({**bn.state_dict(), "num_batches_tracked": value})
        assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.item() == 7
        assert bn.num_batches_tracked.dtype == mg.int64
    theirs = torch.nn.BatchNorm1d(2)
    theirs.load_state_dict({**theirs.state_dict(), "num_batches_tracked": torch.tensor([7])})
    assert theirs.num_batches_tracked.shape == () and theirs.num_batches_tracked.item() == 7
    ours = nn.BatchNorm1d(2)
    for shape in [(2,), (1, 1), (0,)]:
        with pytest.raises(mg.ShapeError, match=rf"'num_batches_tracked' has shape \({shape[0]},"):
            ours.load_state_dict({**ours.state_dict(), "num_batches_tracked": np.zeros(shape, np.int64)})
        with pytest.raises(RuntimeError, match="size mismatch for num_batches_tracked"):
            theirs.load_state_dict({**theirs.state_dict(), "num_batches_tracked": torch.zeros(shape)})
    with pytest.raises(mg.ShapeError, match=r"'running_mean' has shape \(1,\)"):
        ours.load_state_dict({**ours.state_dict(), "running_mean": np.zeros(1)})


def test_batch_norm_running_statistics_by_hand():
    bn = nn.BatchNorm2d(3, momentum=0.1)
    batches = [R.normal(2.0, 3.0, (4, 3, 2, 2)).astype(np.float32) for _ in range(3)]
    mean, var = np.zeros(3), np.ones(3)
    for x in batches:
        out = bn(mg.tensor(x)).numpy()
        m, v = x.mean((0, 2, 3)), x.var((0, 2, 3))
        np.testing.assert_allclose(
            out, (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-5), rtol=1e-4, atol=1e-4
        )
        mean = 0.9 * mean + 0.1 * m
        var = 0.9 * var + 0.1 * x.var((0, 2, 3), ddof=1)
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-5)
    assert bn.num_batches_tracked.item() == 3
    bn.eval()
    x = batches[0]
    want = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(bn(mg.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)


def test_cumulative_moving_average_when_momentum_is_none():
    bn = nn.BatchNorm1d(2, momentum=None)
    xs = [R.normal(size=(5, 2)).astype(np.float32) for _ in range(4)]
    for x in xs:
        bn(mg.tensor(x))
    np.testing.assert_allclose(
        bn.running_mean.numpy(), np.mean([x.mean(0) for x in xs], 0), rtol=1e-5, atol=1e-6
    )


LAYERS = {
    "Linear": (lambda: nn.Linear(4, 3), (2, 4)),
    "Conv2d": (lambda: nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2, bias=False), (1, 2, 5, 5)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2), (1, 2, 3, 3)),
    "LayerNorm": (lambda: nn.LayerNorm(4), (3, 4)),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3)),
    "Embedding": (lambda: nn.Embedding(5, 3), None),
    "activations": (
        lambda: nn.Sequential(
            nn.ReLU6(),
            nn.LeakyReLU(0.1),
            nn.GELU(),
            nn.SiLU(),
            nn.Tanh(),
            nn.Sigmoid(),
            nn.Softmax(dim=1),
            nn.LogSoftmax(dim=1),
        ),
        (3, 4),
    ),
    "pools": (
        lambda: nn.Sequential(
            nn.MaxPool2d(2), nn.AvgPool2d(2, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Identity()
        ),
        (1, 2, 6, 6),
    ),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_gradients(name):
    make, shape = LAYERS[name]
    layer = make().double()
    assert all(p.dtype == mg.float64 and p.requires_grad for p in layer.parameters())
    if shape is None:
        idx = mg.tensor([[0, 2], [4, 1]])
        check_grad(lambda w: nn.functional.embedding(idx, w), layer.weight.numpy())
        return
    check_grad(lambda x: layer(x), R.uniform(-1, 1, shape))


def test_default_initialisation_bounds():
    layer = nn.Linear(100, 50)
    w = layer.weight.numpy()
    assert np.abs(w).max() <= 0.1 and w.std() > 0.04
    conv = nn.Conv2d(8, 4, 3)
    assert np.abs(conv.weight.numpy()).max() <= 1 / np.sqrt(72)
    tensor = mg.zeros(64, 32)
    nn.init.kaiming_normal_(tensor, mode="fan_out", nonlinearity="relu")
    assert abs(tensor.numpy().std() - np.sqrt(2 / 64)) < 0.03
    nn.init.xavier_uniform_(tensor)
    assert np.abs(tensor.numpy()).max() <= np.sqrt(6 / 96)
    nn.init.constant_(tensor, 0.5)
    assert tensor.numpy().min() == 0.5


def test_losses_as_modules():
    x, t = mg.tensor(R.normal(size=(4, 3))), mg.tensor([0, 2, 1, 1])
    assert nn.CrossEntropyLoss(label_smoothing=0.1)(x, t).item() == pytest.approx(
        nn.functional.cross_entropy(x, t, label_smoothing=0.1).item()
    )
    assert nn.CrossEntropyLoss(weight=mg.tensor([1.0, 2.0, 3.0]))(x, t).item() == pytest.approx(
        nn.functional.cross_entropy(x, t, weight=mg.tensor([1.0, 2.0, 3.0])).item()
    )
    y = mg.tensor(R.random((4, 3)))
    assert nn.MSELoss(reduction="sum")(x, y).item() == pytest.approx(((x - y) ** 2).sum().item())
    assert nn.BCEWithLogitsLoss(pos_weight=mg.tensor([2.0, 1.0, 1.0]))(x, y).item() > 0
    assert nn.L1Loss()(x, y).item() == pytest.approx((x - y).abs().mean().item())
    assert nn.NLLLoss()(x.log_softmax if False else nn.functional.log_softmax(x, 1), t).item() > 0
