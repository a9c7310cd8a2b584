"""Data loading, digits, and checkpoints (ours, PyTorch's, and a malicious one)."""

import os
import pickle
import zipfile

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def test_data_loader_batches_shuffle_and_drop_last():
    dataset = mg.data.TensorDataset(np.arange(10), np.arange(10) * 2)
    loader = mg.data.DataLoader(dataset, batch_size=4)
    batches = [(x.tolist(), y.tolist()) for x, y in loader]
    assert batches == [([0, 1, 2, 3], [0, 2, 4, 6]), ([4, 5, 6, 7], [8, 10, 12, 14]), ([8, 9], [16, 18])]
    assert len(mg.data.DataLoader(dataset, batch_size=4, drop_last=True)) == 2
    first = [x.tolist() for x, _ in mg.data.DataLoader(dataset, batch_size=5, shuffle=True, seed=1)]
    again = [x.tolist() for x, _ in mg.data.DataLoader(dataset, batch_size=5, shuffle=True, seed=1)]
    assert (
        first == again
        and sorted(sum(first, [])) == list(range(10))
        and first != [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    )


def test_custom_dataset_and_collate():
    class Squares(mg.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.float32(i), i * i

    x, y = next(iter(mg.data.DataLoader(Squares(), batch_size=3)))
    assert x.dtype == mg.float32 and y.tolist() == [0, 1, 4]


def test_digits():
    pytest.importorskip("sklearn", reason="the digits data set comes with scikit-learn (the examples extra)")
    train, test = mg.datasets.digits(), mg.datasets.digits(train=False)
    assert len(train) + len(test) == 1797 and len(test) == 359
    image, label = train[0]
    assert image.shape == (1, 8, 8) and 0 <= image.min() and image.max() <= 1 and 0 <= label <= 9


def test_save_and_load_round_trip(tmp_path):
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    state = {"model": net.state_dict(), "epoch": 3, "lrs": [0.1, 0.01]}
    mg.save(state, tmp_path / "ckpt.mg")
    loaded = mg.load(tmp_path / "ckpt.mg")
    assert loaded["epoch"] == 3 and loaded["lrs"] == [0.1, 0.01]
    for key, value in net.state_dict().items():
        np.testing.assert_array_equal(loaded["model"][key].numpy(), value.numpy())
        assert loaded["model"][key].dtype == value.dtype
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_pytorch_checkpoint_loads_without_pytorch_and_reproduces_its_outputs():
    state = mg.load(os.path.join(FIXTURES, "small_cnn.pth"))
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    net.load_state_dict(state)
    net.eval()
    io = np.load(os.path.join(FIXTURES, "small_cnn_io.npz"))
    np.testing.assert_allclose(net(mg.tensor(io["x"])).numpy(), io["y"], rtol=1e-5, atol=1e-5)


def test_malicious_pickle_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    path = tmp_path / "evil.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": Evil()}, protocol=2))
    with pytest.raises(mg.MetagraphError, match="posix.system|os.system|not on the allow-list"):
        mg.load(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "junk.pth"
    path.write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(mg.MetagraphError, match="not a zip checkpoint"):
        mg.load(path)
