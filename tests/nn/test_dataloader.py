"""Datasets (digits among them) and the DataLoader, against torch.utils.data where PyTorch
defines the behaviour."""
import collections
import threading
import time

import numpy as np
import pytest

import metagraph as mg
from metagraph import nn

DATASET = mg.data.TensorDataset(np.arange(10), np.arange(10) * 2)


class Squares(mg.data.Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return np.float32(i), i * i


def values(batch):
    """A batch of either library as plain Python: lists for tensors, with their dtype's name."""
    if isinstance(batch, (list, tuple)):
        return type(batch).__name__, [values(b) for b in batch]
    if isinstance(batch, dict):
        return {k: values(v) for k, v in batch.items()}
    if hasattr(batch, "tolist"):
        return str(batch.dtype).split(".")[-1], batch.tolist()
    return batch


def test_batches_and_drop_last_as_pytorch():
    torch = pytest.importorskip("torch")
    for drop_last in (False, True):
        ours = mg.data.DataLoader(DATASET, batch_size=4, drop_last=drop_last)
        theirs = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.arange(10), torch.arange(10) * 2), batch_size=4,
            drop_last=drop_last)
        assert [values(b) for b in ours] == [values(b) for b in theirs]
        assert len(ours) == len(theirs) == (2 if drop_last else 3)


def test_custom_dataset_and_collate():
    x, y = next(iter(mg.data.DataLoader(Squares(), batch_size=3)))
    assert x.dtype == mg.float32 and y.tolist() == [0, 1, 4]
    pairs = mg.data.DataLoader(Squares(), batch_size=2, collate_fn=lambda samples: samples)
    assert [len(batch) for batch in pairs] == [2, 2, 1]


def test_digits():
    pytest.importorskip("sklearn", reason="the digits data set comes with scikit-learn (the examples extra)")
    train, test = mg.datasets.digits(), mg.datasets.digits(train=False)
    assert len(train) + len(test) == 1797 and len(test) == 359
    image, label = train[0]
    assert image.shape == (1, 8, 8) and 0 <= image.min() and image.max() <= 1 and 0 <= label <= 9


def orders(loader):
    return [x.tolist() for x, _ in loader]


def test_shuffle_follows_manual_seed():
    loader = mg.data.DataLoader(DATASET, batch_size=5, shuffle=True)
    mg.manual_seed(7)
    first, second = orders(loader), orders(loader)
    mg.manual_seed(7)
    assert orders(loader) == first and orders(loader) == second
    assert first != second and sorted(sum(first, [])) == list(range(10))


def train(loader):
    model = nn.Linear(2, 1)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_identical_runs_give_identical_losses():
    inputs = np.random.default_rng(0).standard_normal((12, 2)).astype(np.float32)
    dataset = mg.data.TensorDataset(inputs, inputs.sum(1, keepdims=True))
    runs = []
    for _ in range(2):
        mg.manual_seed(3)
        runs.append(train(mg.data.DataLoader(dataset, batch_size=4, shuffle=True)))
    assert runs[0] == runs[1] and len(runs[0]) == 3


def test_a_generator_of_its_own():
    g = mg.Generator()
    assert g.manual_seed(5) is g and g.initial_seed() == 5
    first = orders(mg.data.DataLoader(DATASET, batch_size=5, shuffle=True, generator=g))
    mg.rand(3)                                  # the default generator moves; g does not
    g.manual_seed(5)
    assert orders(mg.data.DataLoader(DATASET, batch_size=5, shuffle=True, generator=g)) == first
    g.manual_seed(1)
    a = [mg.rand(3, generator=g).tolist(), mg.randn(2, generator=g).tolist(),
         mg.randint(0, 9, (4,), generator=g).tolist(), mg.randperm(6, generator=g).tolist()]
    mg.manual_seed(0)
    g.manual_seed(1)
    assert [mg.rand(3, generator=g).tolist(), mg.randn(2, generator=g).tolist(),
            mg.randint(0, 9, (4,), generator=g).tolist(), mg.randperm(6, generator=g).tolist()] == a
    with pytest.raises(mg.ArgumentError, match=r"randperm: generator must be an mg.Generator.*test_data"):
        mg.randperm(3, generator=np.random.default_rng(0))


def test_worker_threads_prefetch_in_order_and_call_worker_init_fn():
    started, threads = [], set()

    class Slow(mg.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            threads.add(threading.current_thread().name)
            time.sleep(0.002 * (i % 3))        # finishing out of order
            return np.array([i, i]), i

    plain = [values(b) for b in mg.data.DataLoader(Slow(), batch_size=2)]
    loader = mg.data.DataLoader(Slow(), batch_size=2, num_workers=2, pin_memory=True, timeout=30,
                                worker_init_fn=started.append, prefetch_factor=3, persistent_workers=True)
    threads.clear()
    assert [values(b) for b in loader] == plain and [values(b) for b in loader] == plain
    assert sorted(started) == list(range(len(started))) and 1 <= len(started) <= 2   # once per thread
    assert threads and all(name.startswith("metagraph-DataLoader") for name in threads)


def test_worker_errors_and_timeouts_reach_the_loop():
    class Broken(mg.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 3:
                raise KeyError("sample 3 is missing")
            time.sleep(0.3 if i == 0 else 0)
            return i

    with pytest.raises(KeyError, match="sample 3"):
        list(mg.data.DataLoader(Broken(), batch_size=1, num_workers=2))
    with pytest.raises(RuntimeError, match="timed out after 0.05 seconds"):
        list(mg.data.DataLoader(Broken(), batch_size=1, num_workers=2, timeout=0.05))


def test_sampler_batch_sampler_and_no_batching_as_pytorch():
    torch = pytest.importorskip("torch")
    data = [(i, float(i) / 2) for i in range(7)]
    cases = [dict(batch_size=2, sampler=[5, 1, 3]), dict(batch_sampler=[[4, 0], [6]]),
             dict(batch_size=None), dict(batch_size=3, drop_last=True, sampler=range(6, -1, -1))]
    for kwargs in cases:
        ours, theirs = mg.data.DataLoader(data, **kwargs), torch.utils.data.DataLoader(data, **kwargs)
        assert [values(b) for b in ours] == [values(b) for b in theirs], kwargs
        assert len(ours) == len(theirs), kwargs


@pytest.mark.parametrize("kwargs", [
    dict(shuffle=True, sampler=[0, 1]), dict(prefetch_factor=2), dict(persistent_workers=True),
    dict(num_workers=-1), dict(timeout=-1), dict(batch_size=0), dict(batch_size=None, drop_last=True),
    dict(batch_size=2, batch_sampler=[[0]]), dict(batch_sampler=[[0]], drop_last=True),
])
def test_argument_errors_as_pytorch(kwargs):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError):
        torch.utils.data.DataLoader(list(range(4)), **kwargs)
    with pytest.raises(mg.ArgumentError, match=r"DataLoader: .*\(at test_dataloader.py:\d+\)"):
        mg.data.DataLoader(list(range(4)), **kwargs)


def test_what_is_not_supported_says_so():
    with pytest.raises(mg.ArgumentError, match="multiprocessing_context is not supported: the workers are"):
        mg.data.DataLoader(list(range(4)), num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(mg.ArgumentError, match="generator must be an mg.Generator"):
        mg.data.DataLoader(list(range(4)), shuffle=True, generator=object())


Point = collections.namedtuple("Point", "x y")


def test_default_collate_as_pytorch():
    torch = pytest.importorskip("torch")
    batches = [
        [(1, 2.0, True), (3, 4.0, False)],
        [np.float32(1), np.float32(2)],
        [np.int32(1), np.int32(5)],
        [{"a": np.zeros(2), "b": [1, 2]}, {"a": np.ones(2), "b": [3, 4]}],
        [Point(1, np.arange(3)), Point(2, np.arange(3))],
        [["x", 1], ["y", 2]],
        [np.arange(6, dtype=np.uint8).reshape(2, 3)] * 2,
    ]
    for batch in batches:
        assert values(mg.data.default_collate(batch)) == values(torch.utils.data.default_collate(batch))
    tensors = [mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0]) * 2]      # realised, and one still lazy
    assert mg.data.default_collate(tensors).tolist() == [[1.0, 2.0], [6.0, 8.0]]
    weight = mg.tensor([1.0, 2.0], requires_grad=True)
    stacked = mg.data.default_collate([weight, weight * 3])        # keeps the gradient, as torch.stack
    stacked.sum().backward()
    assert weight.grad.tolist() == [4.0, 4.0]


def test_default_collate_errors():
    with pytest.raises(mg.ShapeError, match=r"default_collate: samples of lengths \[1, 2\]"):
        mg.data.default_collate([[1, 2], [1]])
    with pytest.raises(mg.ShapeError, match=r"default_collate: samples of shapes \[\(2,\), \(3,\)\]"):
        mg.data.default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(mg.DTypeError, match="batch must contain tensors, .*found <class 'object'>"):
        mg.data.default_collate([object()])
    with pytest.raises(mg.DTypeError, match="found arrays of <U1"):
        mg.data.default_collate([np.array(["a"])])
