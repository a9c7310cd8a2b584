"""The model zoo: state_dict keys and shapes equal torchvision's, and the models run."""
import json
import os

import numpy as np
import pytest

import metagraph as mg

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
EXPECTED = json.load(open(os.path.join(FIXTURES, "torchvision_state_dicts.json")))


@pytest.mark.parametrize("name", sorted(EXPECTED["models"]))
def test_state_dict_keys_and_shapes_equal_torchvision(name):
    model = getattr(mg.models, name)()
    got = [[key, list(value.shape)] for key, value in model.state_dict().items()]
    assert got == EXPECTED["models"][name], EXPECTED["source"]


def test_resnet18_forward_at_224():
    model = mg.models.resnet18().eval()
    with mg.no_grad():
        out = model(mg.randn(2, 3, 224, 224))
    values = out.numpy()
    assert out.shape == (2, 1000) and np.all(np.isfinite(values))


def test_small_models_train_a_step():
    model = mg.models.resnet18(num_classes=10)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = mg.nn.functional.cross_entropy(model(mg.randn(2, 3, 32, 32)), mg.tensor([1, 7]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert np.isfinite(loss.item())
    assert model.layer1[0].bn1.num_batches_tracked.item() == 1


@pytest.mark.parametrize("name", ["alexnet", "vgg11", "mobilenet_v2", "resnet50"])
def test_other_models_run_at_small_resolution(name):
    size = 64 if name == "alexnet" else 32
    model = getattr(mg.models, name)(num_classes=5).eval()
    with mg.no_grad():
        assert model(mg.randn(1, 3, size, size)).shape == (1, 5)
