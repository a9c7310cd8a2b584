"""RNN, LSTM, GRU and their cells against PyTorch (same weights, loaded from its state_dict) and
against finite differences in float64."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn
from tests.helpers import numeric_grad

torch = pytest.importorskip("torch")

SEQ, BATCH, INPUT, HIDDEN = 2, 2, 3, 4
R = np.random.default_rng(7)


def _pair(kind, *args, **options):
    """(ours, PyTorch's) with PyTorch's weights loaded into ours."""
    reference = getattr(torch.nn, kind)(*args, **options)
    model = getattr(nn, kind)(*args, **options)
    model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    return model, reference


def _flat(outputs):
    """A module's outputs as a flat list: output, h_n[, c_n] or a cell's h'[, c']."""
    flat = []
    for value in outputs if isinstance(outputs, tuple) else (outputs,):
        flat.extend(_flat(value) if isinstance(value, tuple) else [value])
    return flat


def _state(shapes, batched_hx):
    """Random initial state arrays for the given shapes (None: no hx)."""
    if not batched_hx:
        return None
    return [R.standard_normal(shape).astype(np.float32) for shape in shapes]


def _check(model, reference, x, hx, pack_hx):
    """Outputs and the gradients of input, hx and every weight agree with PyTorch's."""
    ours_x, their_x = mg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours_hx = [mg.tensor(h, requires_grad=True) for h in hx] if hx else None
    their_hx = [torch.tensor(h, requires_grad=True) for h in hx] if hx else None
    ours = _flat(model(ours_x, pack_hx(ours_hx) if hx else None))
    theirs = _flat(reference(their_x, pack_hx(their_hx) if hx else None))
    assert [o.shape for o in ours] == [tuple(t.shape) for t in theirs]
    projections = [R.standard_normal(o.shape).astype(np.float32) for o in ours]
    mg.sync(*ours)                  # one realisation (each would schedule its graph anew)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-4, atol=1e-5)
    sum(((o * mg.tensor(p)).sum() for o, p in zip(ours, projections)), mg.tensor(0.0)).backward()
    sum((t * torch.tensor(p)).sum() for t, p in zip(theirs, projections)).backward()
    pairs = [("input", ours_x, their_x)] + [(f"hx[{k}]", o, t) for k, (o, t) in
                                             enumerate(zip(ours_hx or [], their_hx or []))]
    pairs += [(name, p, dict(reference.named_parameters())[name]) for name, p in model.named_parameters()]
    for name, o, t in pairs:
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"gradient of {name}")


def _single(hx):
    return hx[0]


def _pair_hx(hx):
    return tuple(hx)


# (kind, options, batch_first, bidirectional, with hx): each mode uni- and bidirectional, with and
# without hx and both batch layouts, two layers; pairwise rather than every combination (each case
# compiles its own kernels).
LAYER_CASES = [
    ("LSTM", {}, False, False, False),
    ("LSTM", {}, True, True, True),
    ("GRU", {}, False, True, True),
    ("GRU", {"bias": False}, True, False, False),
    ("RNN", {"nonlinearity": "tanh"}, True, False, True),
    ("RNN", {"nonlinearity": "relu"}, False, True, False),
    ("LSTM", {"proj_size": 2}, False, True, True),
]


@pytest.mark.parametrize("kind, options, batch_first, bidirectional, with_hx", LAYER_CASES)
def test_layer_against_torch(kind, options, batch_first, bidirectional, with_hx):
    model, reference = _pair(kind, INPUT, HIDDEN, num_layers=2, batch_first=batch_first,
                             bidirectional=bidirectional, **options)
    x = R.standard_normal((BATCH, SEQ, INPUT) if batch_first else (SEQ, BATCH, INPUT)).astype(np.float32)
    states = 2 * (2 if bidirectional else 1)
    shapes = [(states, BATCH, options.get("proj_size") or HIDDEN)]
    if kind == "LSTM":
        shapes.append((states, BATCH, HIDDEN))
    _check(model, reference, x, _state(shapes, with_hx), _pair_hx if kind == "LSTM" else _single)


def test_chunks_of_a_longer_sequence_against_torch():
    """Five steps run as chunks of three and two (rnn.sweep): projections, states and stacking."""
    model, reference = _pair("LSTM", INPUT, HIDDEN, bidirectional=True)
    x = R.standard_normal((5, BATCH, INPUT)).astype(np.float32)
    _check(model, reference, x, _state([(2, BATCH, HIDDEN)] * 2, True), _pair_hx)


@pytest.mark.parametrize("kind, with_hx", [("LSTM", True), ("GRU", False), ("RNN", True)])
def test_unbatched_layer_against_torch(kind, with_hx):
    model, reference = _pair(kind, INPUT, HIDDEN, bidirectional=True)
    shapes = [(2, HIDDEN)] * (2 if kind == "LSTM" else 1)
    x = R.standard_normal((SEQ, INPUT)).astype(np.float32)
    _check(model, reference, x, _state(shapes, with_hx), _pair_hx if kind == "LSTM" else _single)


@pytest.mark.parametrize("kind, options, batched, with_hx", [
    ("RNNCell", {}, True, True),
    ("RNNCell", {"nonlinearity": "relu"}, False, False),
    ("LSTMCell", {}, True, True),
    ("LSTMCell", {"bias": False}, False, False),
    ("GRUCell", {}, True, False),
    ("GRUCell", {}, False, True),
])
def test_cell_against_torch(kind, options, batched, with_hx):
    model, reference = _pair(kind, INPUT, HIDDEN, **options)
    x = R.standard_normal((BATCH, INPUT) if batched else (INPUT,)).astype(np.float32)
    shape = (BATCH, HIDDEN) if batched else (HIDDEN,)
    hx = _state([shape] * (2 if kind == "LSTMCell" else 1), with_hx)
    _check(model, reference, x, hx, _pair_hx if kind == "LSTMCell" else _single)


@pytest.mark.parametrize("kind, options", [("LSTM", {"bidirectional": True}), ("GRU", {"num_layers": 2})])
def test_gradients_against_finite_differences(kind, options):
    """float64: the gradients of input, h_0 (and c_0) and every weight, of all the outputs."""
    model = getattr(nn, kind)(2, 2, **options).double()
    names = list(model.state_dict())
    states = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    arrays = [R.standard_normal((3, 2, 2))] + [R.standard_normal((states, 2, 2))] * (1 + (kind == "LSTM"))
    arrays = [a.copy() for a in arrays] + [R.standard_normal(p.shape) for p in model.state_dict().values()]
    inputs = len(arrays) - len(names)

    def outputs(*tensors):
        model.load_state_dict(dict(zip(names, tensors[inputs:])))
        hx = tensors[1:inputs]
        parts = _flat(model(tensors[0], tuple(hx) if kind == "LSTM" else hx[0]))
        return mg.cat([p.flatten() for p in parts])

    tensors = [mg.tensor(a, requires_grad=k < inputs) for k, a in enumerate(arrays)]
    out = outputs(*tensors)
    projection = R.standard_normal(out.shape)
    (out * mg.tensor(projection)).sum().backward()
    got = [t.grad for t in tensors[:inputs]] + [dict(model.named_parameters())[n].grad for n in names]
    for which, grad in enumerate(got):
        want = numeric_grad(outputs, arrays, projection, which)
        name = names[which - inputs] if which >= inputs else f"input {which}"
        np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-7, err_msg=f"gradient of {name}")


@pytest.mark.parametrize("kind, options", [
    ("LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 3}),
    ("GRU", {"num_layers": 3, "bias": False}),
    ("RNN", {"bidirectional": True, "nonlinearity": "relu", "batch_first": True, "dropout": 0.5}),
    ("RNNCell", {}), ("LSTMCell", {"bias": False}), ("GRUCell", {}),
])
def test_state_dict_repr_and_initialisation_as_torch(kind, options):
    model = getattr(nn, kind)(5, 4, **options)
    reference = getattr(torch.nn, kind)(5, 4, **options)
    assert {k: v.shape for k, v in model.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert list(model.state_dict()) == list(reference.state_dict())
    assert repr(model) == repr(reference)
    values = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    assert np.abs(values).max() <= 0.5 and values.std() > 0.2      # uniform(-1/sqrt(4), 1/sqrt(4))


def test_dropout_between_layers_in_training_only():
    model, reference = _pair("GRU", INPUT, HIDDEN, num_layers=2, dropout=1.0)
    x = R.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    for training in (True, False):           # dropout 1 zeroes the second layer's input
        model.train(training), reference.train(training)
        want = reference(torch.tensor(x))[0].detach().numpy()
        np.testing.assert_allclose(model(mg.tensor(x))[0].numpy(), want, rtol=1e-4, atol=1e-5)
    model.dropout = 0.5
    model.train()
    first, second = model(mg.tensor(x))[0].numpy(), model(mg.tensor(x))[0].numpy()
    assert np.all(np.isfinite(first)) and not np.allclose(first, second)


def test_long_sequence_realises_in_one_graph():
    """200 steps build one lazy graph; it realises without hitting a recursion limit."""
    model, reference = _pair("LSTM", 2, 3)
    x = R.standard_normal((200, 1, 2)).astype(np.float32)
    out, (h, c) = model(mg.tensor(x))
    their_out, (their_h, their_c) = reference(torch.tensor(x))
    np.testing.assert_allclose(c.numpy(), their_c.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), their_out.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_steps_share_their_kernels():
    """Every step reads buffers of its own, so the steps of a sequence launch the same few kernels
    (36 steps: about 230 launches of under 40 kernels; one kernel per launch before)."""
    model = nn.LSTM(2, 3)
    with mg.profile() as prof:
        model(mg.randn(36, 1, 2))[0].numpy()
    assert prof.launches >= 4 * 36 and len(prof.kernels) <= prof.launches // 4


def test_errors_name_the_op_and_the_line():
    lstm, cell = nn.LSTM(3, 4, num_layers=2), nn.GRUCell(3, 4)
    with pytest.raises(mg.ShapeError, match=r"LSTM: input.size\(-1\) must equal input_size=3.*test_rnn.py"):
        lstm(mg.zeros(5, 2, 4))
    with pytest.raises(mg.ShapeError, match=r"LSTM: expected 2-D \(unbatched\) or 3-D input"):
        lstm(mg.zeros(5, 2, 1, 3))
    with pytest.raises(mg.ShapeError, match=r"LSTM: expected a sequence of at least one step"):
        lstm(mg.zeros(0, 2, 3))
    with pytest.raises(mg.ShapeError, match=r"LSTM: expected h_0 .* of shape \(2, 2, 4\), got \(1, 2, 4\)"):
        lstm(mg.zeros(5, 2, 3), (mg.zeros(1, 2, 4), mg.zeros(2, 2, 4)))
    with pytest.raises(mg.ArgumentError, match=r"LSTM: hx must be a tuple \(h_0, c_0\)"):
        lstm(mg.zeros(5, 2, 3), mg.zeros(2, 2, 4))
    with pytest.raises(mg.ShapeError, match=r"GRUCell: expected input of shape \(batch, 3\) or \(3,\)"):
        cell(mg.zeros(2, 5))
    with pytest.raises(mg.ShapeError, match=r"GRUCell: expected hx of shape \(2, 4\), got \(3, 4\)"):
        cell(mg.zeros(2, 3), mg.zeros(3, 4))
    with pytest.raises(mg.ArgumentError, match="unknown nonlinearity 'gelu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(mg.ArgumentError, match=r"dropout must be a number in \[0, 1\]"):
        nn.GRU(3, 4, dropout=1.5)
    with pytest.raises(mg.ArgumentError, match=r"proj_size must be in \[0, hidden_size=4\)"):
        nn.LSTM(3, 4, proj_size=4)
