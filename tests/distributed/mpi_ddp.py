"""Run by test_mpi.py under `mpirun -n 2`: DistributedDataParallel on 2 ranks x batch B trains the
same parameters as one process on the batch of 2B (rank 0 trains that process's model beside its
DDP one). The model is a small CNN without BatchNorm (conv, relu, max-pool, conv, relu, linear),
in float64: BatchNorm normalises each rank's batch with that batch's own statistics, so a network
with it computes something else on B than on 2B, in PyTorch as here. BatchNorm's per-rank
statistics and the buffer broadcast are checked on their own below. Prints "ddp ok"."""
import numpy as np

import metagraph as mg
import metagraph.distributed as dist
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.nn.parallel import DistributedDataParallel

RANK, SIZE = dist.get_rank(), dist.get_world_size()
B, STEPS = 4, 4


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc(F.relu(self.conv2(x)).flatten(1))


def gathered(tensor):
    """Every rank's value of tensor, stacked."""
    out = [mg.zeros(*tensor.shape, dtype=tensor.dtype) for _ in range(SIZE)]
    dist.all_gather(out, tensor.detach())
    return np.stack([t.numpy() for t in out])


mg.manual_seed(100 + RANK)          # every rank initialises differently: DDP broadcasts rank 0's weights
model = SmallCNN().double()
initial = {name: value.numpy().copy() for name, value in model.state_dict().items()}
ddp = DistributedDataParallel(model)
for name, value in ddp.state_dict().items():
    assert name.startswith("module."), name
    everyone = gathered(value)
    assert (everyone[0] == everyone[1]).all(), f"{name} differs between ranks after wrapping"

# One process on the whole batch, from rank 0's initial weights.
mg.manual_seed(100)
reference = SmallCNN().double()
data = np.random.default_rng(7).standard_normal((STEPS + 1, SIZE * B, 1, 8, 8))
labels = np.random.default_rng(8).integers(0, 5, (STEPS + 1, SIZE * B))
optimizer = mg.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
reference_optimizer = mg.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
for step in range(STEPS):
    mine = slice(RANK * B, (RANK + 1) * B)
    optimizer.zero_grad()
    F.cross_entropy(ddp(mg.tensor(data[step, mine])), mg.tensor(labels[step, mine])).backward()
    optimizer.step()
    reference_optimizer.zero_grad()
    F.cross_entropy(reference(mg.tensor(data[step])), mg.tensor(labels[step])).backward()
    reference_optimizer.step()

# Gradient accumulation: two half-batches per rank, the first under no_sync(), each loss halved.
optimizer.zero_grad()
reference_optimizer.zero_grad()
halves = [slice(RANK * B, RANK * B + B // 2), slice(RANK * B + B // 2, (RANK + 1) * B)]
with ddp.no_sync():
    half = halves[0]
    (F.cross_entropy(ddp(mg.tensor(data[STEPS, half])), mg.tensor(labels[STEPS, half])) / 2).backward()
half = halves[1]
(F.cross_entropy(ddp(mg.tensor(data[STEPS, half])), mg.tensor(labels[STEPS, half])) / 2).backward()
optimizer.step()
F.cross_entropy(reference(mg.tensor(data[STEPS])), mg.tensor(labels[STEPS])).backward()
reference_optimizer.step()

largest = 0.0
for (name, got), want in zip(model.named_parameters(), reference.parameters()):
    everyone = gathered(got)
    assert (everyone[0] == everyone[1]).all(), f"{name} differs between the ranks"
    difference = np.abs(got.numpy() - want.numpy()).max()
    largest = max(largest, difference)
    assert difference < 1e-6, f"{name}: DDP and one process differ by {difference}"
    assert np.abs(got.numpy() - initial[name]).max() > 1e-3 or RANK != 0, f"{name} did not train"

# Jittor's habit: optimizer.step(loss) computes the gradients with mg.grad, averaged too.
before = [p.numpy().copy() for p in model.parameters()]
optimizer.step(F.cross_entropy(ddp(mg.tensor(data[0, RANK * B:(RANK + 1) * B])),
                               mg.tensor(labels[0, RANK * B:(RANK + 1) * B])))
for p, old in zip(model.parameters(), before):
    everyone = gathered(p)
    assert (everyone[0] == everyone[1]).all() and np.abs(everyone[0] - old).max() > 0

# A parameter that only rank 0 uses: find_unused_parameters averages rank 0's gradient with rank 1's
# nothing, on both ranks.
class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared, self.extra = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x, use_extra):
        return self.shared(x) + (self.extra(x) if use_extra else 0)


mg.manual_seed(5)
branches = DistributedDataParallel(Branches().double(), find_unused_parameters=True)
x = mg.tensor(np.full((2, 3), float(RANK + 1)))
branches(x, use_extra=RANK == 0).sum().backward()
np.testing.assert_allclose(branches.module.extra.bias.grad.numpy(), [1.0, 1.0])          # (2 + 0) / 2
np.testing.assert_allclose(branches.module.shared.weight.grad.numpy(), np.full((2, 3), 3.0))   # (2 + 4) / 2

# BatchNorm: each rank normalises with its own batch's statistics and keeps its own running ones;
# with broadcast_buffers (the default) the next forward pass starts from rank 0's.
for broadcast in (False, True):
    mg.manual_seed(3)
    normed = DistributedDataParallel(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)).double(),
                                     broadcast_buffers=broadcast)
    batch = mg.tensor(np.random.default_rng(RANK).standard_normal((4, 1, 3, 3)) * (RANK + 1))
    out = normed(batch)
    np.testing.assert_allclose(out.numpy().mean(axis=(0, 2, 3)), 0, atol=1e-12)    # this rank's statistics
    out.sum().backward()
    running = normed.module[1].running_mean
    first = gathered(running)                 # 0.1 x each rank's batch mean (they started at 0)
    assert not np.allclose(first[0], first[1]), "running statistics should differ between ranks"
    normed(batch)          # starts from rank 0's running statistics when broadcast, else from its own
    start = first[0] if broadcast else first[RANK]
    np.testing.assert_allclose(running.numpy(), 0.9 * start + first[RANK], rtol=1e-10)
    everyone = gathered(normed.module[1].num_batches_tracked)
    assert (everyone == 2).all(), everyone
print(f"rank {RANK}: ddp ok (largest difference from one process: {largest:.1e})", flush=True)
