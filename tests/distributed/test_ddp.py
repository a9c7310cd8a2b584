"""DistributedDataParallel in a world of one process, where averaging over the ranks changes
nothing: it must train exactly as the bare model does, through the same bucketing, reduction and
no_sync() paths that test_mpi.py runs on two ranks."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.nn.parallel import DistributedDataParallel, make_buckets


def small_cnn():
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3 * 4 * 4, 4))


def twins(make=small_cnn, **options):
    mg.manual_seed(0)
    bare = make().double()
    wrapped = make().double()
    wrapped.load_state_dict(bare.state_dict())
    return bare, DistributedDataParallel(wrapped, **options)


def batches(count, size=6):
    rng = np.random.default_rng(1)
    return [(mg.tensor(rng.standard_normal((size, 1, 8, 8))), mg.tensor(rng.integers(0, 4, size)))
            for _ in range(count)]


def assert_same_parameters(bare, wrapped):
    for (name, want), got in zip(bare.named_parameters(), wrapped.module.parameters()):
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)


def train_both(models, optimizers, steps):
    """`steps` SGD steps of each model with its optimizer on the same batches."""
    for x, y in batches(steps):
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def test_it_trains_as_the_bare_model_and_passes_forward_and_state_through():
    bare, wrapped = twins()
    assert wrapped.module is not bare
    assert list(wrapped.state_dict()) == ["module." + k for k in bare.state_dict()]
    optimizers = [mg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (bare, wrapped)]
    train_both((bare, wrapped), optimizers, 3)
    assert_same_parameters(bare, wrapped)
    copy = DistributedDataParallel(small_cnn().double())
    copy.load_state_dict(wrapped.state_dict())
    assert_same_parameters(bare, copy)
    x = batches(1)[0][0]
    with mg.no_grad():
        np.testing.assert_array_equal(wrapped(x).numpy(), bare(x).numpy())


def test_no_sync_accumulates_and_the_next_pass_averages_the_sum():
    bare, wrapped = twins()
    (x1, y1), (x2, y2), (x3, y3) = batches(3)
    for x, y in ((x1, y1), (x2, y2), (x3, y3)):
        F.cross_entropy(bare(x), y).backward()
    with wrapped.no_sync():
        F.cross_entropy(wrapped(x1), y1).backward()
        F.cross_entropy(wrapped(x2), y2).backward()
    F.cross_entropy(wrapped(x3), y3).backward()
    for want, got in zip(bare.parameters(), wrapped.parameters()):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_gradients_keep_their_values_when_the_next_step_reuses_the_buckets():
    _, wrapped = twins()
    (x1, y1), (x2, y2) = batches(2)
    optimizer = mg.optim.SGD(wrapped.parameters(), lr=0.1)
    F.cross_entropy(wrapped(x1), y1).backward()
    kept = wrapped.module[0].weight.grad
    value = kept.numpy().copy()
    flats = [id(bucket.flat) for bucket in wrapped._buckets]     # ids: holding them would keep them in use
    optimizer.step()
    optimizer.zero_grad()
    F.cross_entropy(wrapped(x2), y2).backward()
    np.testing.assert_array_equal(kept.numpy(), value)       # a gradient still held is never overwritten
    assert id(wrapped._buckets[-1].flat) != flats[-1]        # the first layer's weight is in the last bucket
    del kept
    flats = [id(bucket.flat) for bucket in wrapped._buckets]
    optimizer.step()
    optimizer.zero_grad()
    F.cross_entropy(wrapped(x1), y1).backward()
    assert [id(bucket.flat) for bucket in wrapped._buckets] == flats      # nothing held: reused


def test_one_collective_per_bucket_per_backward():
    _, wrapped = twins(bucket_cap_mb=0.0005)       # 524 bytes: several buckets for this model
    x, y = batches(1)[0]
    with mg.profile() as report:
        F.cross_entropy(wrapped(x), y).backward()
    names = [event.name for event in report.events if event.category == "collective"]
    assert len(wrapped._buckets) > 1 and names == ["all_reduce (DDP bucket)"] * len(wrapped._buckets)
    assert report.collective_bytes >= sum(p.numel() * 8 for p in wrapped.parameters())


def test_buckets_take_parameters_in_reverse_order_by_dtype_and_size():
    parameters = [nn.Parameter(mg.zeros(n, dtype=dtype)) for n, dtype in
                  [(100, mg.float32), (10, mg.float64), (300, mg.float32), (50, mg.float32), (5, mg.float64)]]
    buckets = make_buckets(parameters, first_bytes=1024, bucket_bytes=1300)
    assert [(b.dtype, b.members) for b in buckets] == [(mg.float64, [4, 1]), (mg.float32, [3]),
                                                       (mg.float32, [2]), (mg.float32, [0])]
    for bucket in buckets:
        for (start, stop), position in zip(bucket.ranges, bucket.members):
            assert start * bucket.dtype.itemsize % 64 == 0 and stop - start == parameters[position].numel()
    [single] = make_buckets(parameters[:1], first_bytes=8, bucket_bytes=8)     # one larger than the cap
    assert single.members == [0]
    small = [nn.Parameter(mg.zeros(10)) for _ in range(3)]       # 40 bytes each, 64 with alignment
    assert [b.members for b in make_buckets(small, first_bytes=80, bucket_bytes=1000)] == [[2], [1, 0]]


def test_an_unused_parameter_is_an_error_unless_find_unused_parameters():
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)
    mg.manual_seed(0)
    x = mg.randn(4, 3)
    with pytest.raises(mg.distributed.DistributedError,
                       match=r"parameter\(s\) unused.weight, unused.bias got no gradient"):
        DistributedDataParallel(Branches())(x).sum().backward()
    wrapped = DistributedDataParallel(Branches(), find_unused_parameters=True)
    wrapped(x).sum().backward()
    assert wrapped.module.unused.weight.grad is None
    np.testing.assert_allclose(wrapped.module.used.bias.grad.numpy(), [4.0, 4.0])


def test_jittor_step_with_the_loss_averages_through_mg_grad():
    bare, wrapped = twins()
    x, y = batches(1)[0]
    for model in (bare, wrapped):
        mg.optim.SGD(model.parameters(), lr=0.1).step(F.cross_entropy(model(x), y))
    assert_same_parameters(bare, wrapped)


def test_what_it_refuses():
    with pytest.raises(mg.ArgumentError, match="no parameter that requires a gradient"):
        DistributedDataParallel(nn.ReLU())
    with pytest.raises(mg.ArgumentError, match="expected an nn.Module"):
        DistributedDataParallel(lambda x: x)
    with pytest.raises(mg.ArgumentError, match="device_ids"):
        DistributedDataParallel(nn.Linear(2, 2), device_ids=[0])
    with pytest.raises(mg.ArgumentError, match="bucket_cap_mb must be positive"):
        DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0)
    wrapped = DistributedDataParallel(nn.Linear(2, 2))
    loss = (wrapped(mg.randn(3, 2)) ** 2).sum()        # its gradients depend on the parameters
    with pytest.raises(mg.Unsupported, match="create_graph=True"):
        mg.grad(loss, list(wrapped.parameters()), create_graph=True)


def test_buffers_are_kept_and_batch_statistics_are_the_ranks_own():
    def with_norm():
        return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 6 * 6, 4))
    bare, wrapped = twins(with_norm)
    optimizers = [mg.optim.SGD(m.parameters(), lr=0.1) for m in (bare, wrapped)]
    train_both((bare, wrapped), optimizers, 2)
    assert_same_parameters(bare, wrapped)
    for want, got in zip(bare.buffers(), wrapped.module.buffers()):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_wrapped_model_converted_to_another_dtype_is_bucketed_again():
    bare, wrapped = twins()
    bare.float()
    wrapped.float()
    x, y = batches(1)[0]
    for model in (bare, wrapped):
        F.cross_entropy(model(x.float()), y).backward()
    assert all(b.dtype == mg.float32 for b in wrapped._buckets)
    for want, got in zip(bare.parameters(), wrapped.parameters()):
        assert got.grad.dtype == mg.float32
        np.testing.assert_array_equal(got.grad.numpy(), want.grad.numpy())
