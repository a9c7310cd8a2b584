"""bench_transformer.training_step, the training-step closure the benchmark workloads share (W6's
ResNet-18 and W11's GPT), runs the same step on metagraph and on PyTorch."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.bench_transformer import training_step

torch = pytest.importorskip("torch")


def test_one_step_each_framework_same_loss_and_weights():
    rng = np.random.default_rng(0)
    data, labels = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    ours, theirs = nn.Linear(5, 3), torch.nn.Linear(5, 3)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x, y, tx, ty = mg.tensor(data), mg.tensor(labels), torch.from_numpy(data), torch.from_numpy(labels)
    step = training_step(lambda: F.cross_entropy(ours(x), y), mg.optim.SGD(ours.parameters(), lr=0.5))
    their_step = training_step(lambda: torch.nn.functional.cross_entropy(theirs(tx), ty),
                               torch.optim.SGD(theirs.parameters(), lr=0.5))
    for _ in range(3):
        loss, their_loss = step(), their_step()
        assert isinstance(loss, float) and loss == pytest.approx(their_loss, rel=1e-5)
    np.testing.assert_allclose(ours.weight.numpy(), theirs.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
