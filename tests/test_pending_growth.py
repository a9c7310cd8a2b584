"""A training loop never makes the pending graph grow with the steps it has run."""
import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn


def _pending(node):
    """The unrealised nodes a node's value still depends on."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n.buffer is not None or id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n.inputs)
    return len(seen)


def test_a_running_total_of_detached_losses_holds_no_forward_graph():
    """total = total + loss.detach() each step: the loss is computed with the optimizer's step, so
    the total is a chain of additions of values, not of every step's forward pass."""
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01)
    x, y = mg.randn(4, 6), mg.randint(0, 3, (4,))
    total = mg.zeros(())
    for _ in range(20):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert loss.node.buffer is not None
        total = total + loss.detach()
    assert _pending(total.node) <= 2 * 20 + 1
