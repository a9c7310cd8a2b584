"""Sequence-model workloads for the benchmark suite (metagraph.bench wires them in).

W12: a one-layer LSTM, input 64, hidden 256, batch 32, sequence 64, forward and backward: the
gradients of every weight and of the input, read back so that the work is complete.
"""
import numpy as np

import metagraph as mg

SEQUENCE, BATCH, INPUT, HIDDEN = 64, 32, 64, 256


def lstm_workload():
    """W12: (metagraph callable, PyTorch callable or None), each one forward and backward pass of
    the same LSTM (PyTorch's weights copied into metagraph's) on the same input."""
    data = np.random.default_rng(0).standard_normal((SEQUENCE, BATCH, INPUT)).astype(np.float32)
    model = mg.nn.LSTM(INPUT, HIDDEN)
    x = mg.tensor(data, requires_grad=True)
    weights = list(model.parameters())

    def ours():
        x.grad = None
        model.zero_grad()
        output, _ = model(x)
        output.sum().backward()
        mg.sync(x.grad, *[w.grad for w in weights])
    try:
        import torch
    except ImportError:
        return ours, None
    reference = torch.nn.LSTM(INPUT, HIDDEN)
    model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    t = torch.from_numpy(data).requires_grad_()

    def theirs():
        t.grad = None
        reference.zero_grad()
        output, _ = reference(t)
        output.sum().backward()
    return ours, theirs
