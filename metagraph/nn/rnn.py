"""Recurrent layers as PyTorch's: RNN, LSTM and GRU over sequences, and their one-step cells.

Parameter names, shapes, gate order and initialisation are PyTorch's, so that its state_dict
loads. A layer projects its input ahead of the time steps (one matmul per chunk of about
sqrt(seq) steps, both biases folded in where the gate math allows: see `sweep`), so that a step
costs one hidden matmul for all gates, split by slicing, and the element-wise gate math.
Gradients come from the table, as for every composite: nothing here is differentiated by hand.

A layer unrolls into one lazy graph, which the compiler sees as hundreds of small kernels. Two
choices keep that graph small and its kernels the same from step to step:
- a step's pre-activation is materialised (`contiguous`) where it is formed, so that the step's
  other kernels, forward and backward, read a buffer of their own and not the projection at the
  step's offset (a kernel reading at another offset is another kernel to compile);
- the gates take one sigmoid over all of them, and tanh is 2 sigmoid(2x) - 1: m.tanh's Taylor
  branch near 0 (exact there in relative terms) makes the backward pass of a step three times as
  many kernels. The identity is exact; it rounds to within 1.2e-7 of tanh in float32 (absolute).
"""
import math

from metagraph import creation
from metagraph.errors import ArgumentError, ShapeError, fail
from metagraph.nn.layers import _uniform_parameter
from metagraph.nn.module import Module
from metagraph.ops import loss as ls, math as m, movement as mv
from metagraph.ops.linalg import matmul
from metagraph.ops.recorded import recorded
from metagraph.tensor import Tensor

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
NONLINEARITIES = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}


# ---- one time step, on nodes; gates_x is the step's input projection with its folded biases ----

def tanh(x):
    """tanh(x) = 2 sigmoid(2x) - 1 (see the module docstring)."""
    return m.sigmoid(x * 2.0) * 2.0 - 1.0


def _hidden_projection(gates_x, h, w_hh):
    """gates_x + h W_hh^T, materialised: the step's other kernels read it at offset 0."""
    return mv.contiguous(gates_x + matmul(h, mv.T(w_hh)))


@recorded
def rnn_step(gates_x, h, w_hh, nonlinearity):
    """Elman's step: nonlinearity(x W_ih^T + b_ih + h W_hh^T + b_hh)."""
    pre = _hidden_projection(gates_x, h, w_hh)
    return m.relu(pre) if nonlinearity == "relu" else tanh(pre)


@recorded
def lstm_step(gates_x, h, c, w_hh, w_hr=None):
    """PyTorch's LSTM step, gates in the order i, f, g, o; `w_hr` (proj_size) projects the new h.
    All four gates are one sigmoid: of 2x for g, then 2y - 1, which is tanh(x)."""
    pre = _hidden_projection(gates_x, h, w_hh)
    ones, twos = m.const(1.0, c.shape[-1:], pre.dtype), m.const(2.0, c.shape[-1:], pre.dtype)
    scale = mv.cat([ones, ones, twos, ones], 0)
    i, f, g, o = mv.chunk(m.sigmoid(pre * scale) * scale - (scale - 1.0), 4, -1)
    c = f * c + i * g
    h = o * tanh(c)
    return (h if w_hr is None else matmul(h, mv.T(w_hr))), c


@recorded
def gru_step(gates_x, h, w_hh, b_hn=None):
    """PyTorch's GRU step, gates in the order r, z, n. The n gate's hidden part (with its bias
    b_hn) is multiplied by r, so it is kept apart from the input's: the materialised
    pre-activation holds x_r + h_r, x_z + h_z and x_n."""
    hidden = h.shape[-1]
    hh = matmul(h, mv.T(w_hh))
    pre = mv.contiguous(gates_x + mv.pad(mv.slice_dim(hh, -1, 0, 2 * hidden), (0, hidden)))
    r, z = mv.chunk(m.sigmoid(mv.slice_dim(pre, -1, 0, 2 * hidden)), 2, -1)
    h_n = mv.slice_dim(hh, -1, 2 * hidden, 3 * hidden)
    n = tanh(mv.slice_dim(pre, -1, 2 * hidden, 3 * hidden) + r * (h_n if b_hn is None else h_n + b_hn))
    return n + z * (h - n)          # (1 - z) * n + z * h


def folded_biases(mode, b_ih, b_hh):
    """The bias added to the input projection once for all steps, and what a step must add itself
    (GRU's n-gate hidden bias, which PyTorch multiplies by r; else None)."""
    if b_ih is None:
        return None, None
    if mode != "GRU":
        return b_ih + b_hh, None
    hidden = b_hh.shape[0] // 3
    r_z = mv.pad(mv.slice_dim(b_hh, 0, 0, 2 * hidden), (0, hidden))
    return b_ih + r_z, mv.slice_dim(b_hh, 0, 2 * hidden, 3 * hidden)


def step(mode, gates_x, state, w_hh, inner):
    """One time step of `mode`: the new state, (h,) or LSTM's (h, c). `inner` is what the step
    adds itself: LSTM's projection w_hr, GRU's n-gate bias (or None)."""
    if mode == "LSTM":
        return lstm_step(gates_x, state[0], state[1], w_hh, inner)
    if mode == "GRU":
        return (gru_step(gates_x, state[0], w_hh, inner),)
    return (rnn_step(gates_x, state[0], w_hh, "relu" if mode == "RNN_RELU" else "tanh"),)


def chunk_size(seq):
    """Steps per chunk: about sqrt(seq) (see `sweep`)."""
    return math.isqrt(seq - 1) + 1 if seq > 1 else 1


def sweep(mode, x, w_ih, bias, state, w_hh, inner, reverse):
    """One direction of one layer over x (seq, batch, input): the hidden states in time order,
    (seq, batch, hidden), and the last state.

    The sequence runs in chunks of about sqrt(seq) steps. A chunk projects its input in one matmul
    over (chunk * batch) rows before its steps, and stacks its steps' hidden states into one
    buffer after them. Both are gathers whose cost per element grows with the number of parts: the
    gradient of T step views of one projection is a sum of T padded views (T loads per element),
    and a stack of T steps is a chain of T selects, one kernel reading T buffers. Per chunk both
    are sqrt(T), and the steps of every chunk read their projection at the same offsets, so
    their kernels compile once, not once per step."""
    seq, batch = x.shape[:2]
    size = chunk_size(seq)
    starts = range(0, seq, size)
    outputs = [None] * len(starts)
    for k in (reversed(range(len(starts))) if reverse else range(len(starts))):
        part = mv.slice_dim(x, 0, starts[k], starts[k] + size)
        rows = ls.linear(mv.reshape(part, (part.shape[0] * batch, x.shape[2])), w_ih, bias)
        steps = mv.unbind(mv.reshape(rows, (part.shape[0], batch, rows.shape[1])), 0)
        hidden = [None] * len(steps)
        for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
            state = step(mode, steps[t], state, w_hh, inner)
            hidden[t] = state[0]
        outputs[k] = mv.contiguous(mv.stack(hidden, 0))
    return (outputs[0] if len(outputs) == 1 else mv.cat(outputs, 0)), state


def _check_size(name, what, got, want):
    if tuple(got) != tuple(want):
        fail(ShapeError, name, f"expected {what} of shape {tuple(want)}, got {tuple(got)}")


class RNNBase(Module):
    """What RNN, LSTM and GRU share: PyTorch's parameters, hidden-state checks and the layer loop."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0):
        super().__init__()
        name = type(self).__name__
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ArgumentError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        if hidden_size <= 0 or num_layers <= 0:
            raise ArgumentError(f"{name}: hidden_size and num_layers must be positive, got "
                                f"{hidden_size} and {num_layers}")
        if proj_size < 0 or (proj_size and proj_size >= hidden_size):
            raise ArgumentError(f"{name}: proj_size must be in [0, hidden_size={hidden_size}), "
                                f"got {proj_size}")
        if proj_size and mode != "LSTM":
            raise ArgumentError(f"{name}: proj_size is only supported by LSTM")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, proj_size
        directions = 2 if bidirectional else 1
        out_size = proj_size or hidden_size
        gates = GATES[mode] * hidden_size
        bound = 1 / math.sqrt(hidden_size)
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else out_size * directions
            for suffix in ("", "_reverse")[:directions]:
                # registration order is PyTorch's, and so is the state_dict's
                setattr(self, f"weight_ih_l{layer}{suffix}", _uniform_parameter((gates, layer_input), bound))
                setattr(self, f"weight_hh_l{layer}{suffix}", _uniform_parameter((gates, out_size), bound))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", _uniform_parameter((gates,), bound))
                    setattr(self, f"bias_hh_l{layer}{suffix}", _uniform_parameter((gates,), bound))
                if proj_size:
                    setattr(self, f"weight_hr_l{layer}{suffix}",
                            _uniform_parameter((proj_size, hidden_size), bound))

    def flatten_parameters(self):
        """PyTorch's cuDNN weight packing: nothing to do here (kept so ported code runs)."""

    def _weights(self, layer, suffix):
        """(w_ih, w_hh, b_ih, b_hh, w_hr) of one layer and direction, as nodes (None where absent)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
        params = [self._parameters.get(f"{name}_l{layer}{suffix}") for name in names]
        return [p.node if p is not None else None for p in params]

    def _initial_state(self, hx, batch, batched, dtype):
        """The initial state as a tuple of (layers * directions, batch, size) nodes: hx or zeros."""
        name, directions = type(self).__name__, 2 if self.bidirectional else 1
        sizes = (self.proj_size or self.hidden_size,) + ((self.hidden_size,) if self.mode == "LSTM" else ())
        shapes = [(self.num_layers * directions, batch, size) for size in sizes]
        if hx is None:
            return tuple(creation.zeros(*shape, dtype=dtype).node for shape in shapes)
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                fail(ArgumentError, name, "hx must be a tuple (h_0, c_0)")
            given = tuple(hx)
        else:
            if not isinstance(hx, Tensor):
                fail(ArgumentError, name, f"hx must be a Tensor, got {type(hx).__name__}")
            given = (hx,)
        state = []
        for tensor, shape, what in zip(given, shapes, ("h_0", "c_0")):
            want = shape if batched else shape[:1] + shape[2:]
            _check_size(name, f"{what} (layers * directions, {'batch, ' if batched else ''}size)",
                        tensor.shape, want)
            state.append(tensor.node if batched else mv.unsqueeze(tensor.node, 1))
        return tuple(state)

    def forward(self, input, hx=None):
        """(output, h_n), or LSTM's (output, (h_n, c_n)), with PyTorch's shapes; a 2-D input is
        one unbatched sequence."""
        name = type(self).__name__
        if input.ndim not in (2, 3):
            fail(ShapeError, name, f"expected 2-D (unbatched) or 3-D input, got shape {input.shape}")
        if input.shape[-1] != self.input_size:
            fail(ShapeError, name, f"input.size(-1) must equal input_size={self.input_size}, got input "
                                   f"of shape {input.shape}")
        batched = input.ndim == 3
        x = input.node
        if not batched:
            x = mv.unsqueeze(x, 1)
        elif self.batch_first:
            x = mv.transpose(x, 0, 1)
        if x.shape[0] == 0:
            fail(ShapeError, name, f"expected a sequence of at least one step, got input of shape "
                                   f"{input.shape}")
        state = [mv.unbind(s, 0) for s in self._initial_state(hx, x.shape[1], batched, x.dtype)]
        suffixes = ("", "_reverse") if self.bidirectional else ("",)
        finals = [[] for _ in state]
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                uniform = creation.rand(x.shape, dtype=x.dtype, device=x.device or "cpu")
                x = ls.dropout(x, self.dropout, uniform.node)
            outputs = []
            for d, suffix in enumerate(suffixes):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, suffix)
                bias, inner = folded_biases(self.mode, b_ih, b_hh)
                begin = tuple(s[layer * len(suffixes) + d] for s in state)
                out, last = sweep(self.mode, x, w_ih, bias, begin, w_hh,
                                  w_hr if self.mode == "LSTM" else inner, reverse=d == 1)
                outputs.append(out)
                for final, value in zip(finals, last):
                    final.append(value)
            x = outputs[0] if len(outputs) == 1 else mv.cat(outputs, -1)
        if not batched:
            x = mv.squeeze(x, 1)
        elif self.batch_first:
            x = mv.transpose(x, 0, 1)
        final = [Tensor(mv.stack(f, 0) if batched else mv.squeeze(mv.stack(f, 0), 1)) for f in finals]
        return Tensor(x), (final[0] if len(final) == 1 else tuple(final))

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            text += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        if self.batch_first:
            text += ", batch_first=True"
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text


class RNN(RNNBase):
    """Elman RNN: h_t = tanh or relu(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), as torch.nn.RNN."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False):
        if nonlinearity not in NONLINEARITIES:
            raise ArgumentError(f"RNN: unknown nonlinearity {nonlinearity!r}; select 'tanh' or 'relu'")
        super().__init__(NONLINEARITIES[nonlinearity], input_size, hidden_size, num_layers, bias,
                         batch_first, dropout, bidirectional)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Long short-term memory, as torch.nn.LSTM (gates i, f, g, o; proj_size projects h)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size)


class GRU(RNNBase):
    """Gated recurrent unit, as torch.nn.GRU (gates r, z, n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional)


class RNNCellBase(Module):
    """What the cells share: one time step of their layer, on (batch, input) or (input,) input."""

    def __init__(self, mode, input_size, hidden_size, bias):
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        gates, bound = GATES[mode] * hidden_size, 1 / math.sqrt(hidden_size)
        self.weight_ih = _uniform_parameter((gates, input_size), bound)
        self.weight_hh = _uniform_parameter((gates, hidden_size), bound)
        self.bias_ih = _uniform_parameter((gates,), bound) if bias else None
        self.bias_hh = _uniform_parameter((gates,), bound) if bias else None

    def _step(self, input, hx):
        """The new state (h,) or (h, c) as Tensors, each shaped as the input is batched or not."""
        name = type(self).__name__
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            fail(ShapeError, name, f"expected input of shape (batch, {self.input_size}) or "
                                   f"({self.input_size},), got {input.shape}")
        batched = input.ndim == 2
        x = input.node if batched else mv.unsqueeze(input.node, 0)
        shape = (x.shape[0], self.hidden_size)
        if hx is None:
            hx = (None,) * (2 if self.mode == "LSTM" else 1)
        elif self.mode != "LSTM":
            hx = (hx,)
        state = []
        for tensor, what in zip(hx, ("hx", "cx")):
            if tensor is None:
                state.append(creation.zeros(*shape, dtype=x.dtype).node)
                continue
            _check_size(name, what, tensor.shape, shape if batched else shape[1:])
            state.append(tensor.node if batched else mv.unsqueeze(tensor.node, 0))
        params = [p.node if p is not None else None
                  for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)]
        bias, inner = folded_biases(self.mode, params[2], params[3])
        new = step(self.mode, ls.linear(x, params[0], bias), tuple(state), params[1], inner)
        return tuple(Tensor(v if batched else mv.squeeze(v, 0)) for v in new)

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        if self.mode == "RNN_RELU":
            text += ", nonlinearity=relu"
        return text


class RNNCell(RNNCellBase):
    """One Elman step, as torch.nn.RNNCell: forward(input, hx=None) returns h'."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh"):
        if nonlinearity not in NONLINEARITIES:
            raise ArgumentError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; select 'tanh' or 'relu'")
        super().__init__(NONLINEARITIES[nonlinearity], input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        return self._step(input, hx)[0]


class LSTMCell(RNNCellBase):
    """One LSTM step, as torch.nn.LSTMCell: forward(input, (h, c)=None) returns (h', c')."""

    def __init__(self, input_size, hidden_size, bias=True):
        super().__init__("LSTM", input_size, hidden_size, bias)

    def forward(self, input, hx=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            fail(ArgumentError, "LSTMCell", "hx must be a tuple (h_0, c_0)")
        return self._step(input, hx)


class GRUCell(RNNCellBase):
    """One GRU step, as torch.nn.GRUCell: forward(input, hx=None) returns h'."""

    def __init__(self, input_size, hidden_size, bias=True):
        super().__init__("GRU", input_size, hidden_size, bias)

    def forward(self, input, hx=None):
        return self._step(input, hx)[0]
