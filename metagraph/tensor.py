"""Tensor: the user's handle on a lazy graph node, with PyTorch's methods and operators.

A Tensor points at an immutable node; in-place operations point it at a new node. Methods are
the composites of `metagraph.ops`, lifted so that they take and return Tensors.
"""
import functools
import weakref

import numpy as np

from metagraph import backend, dtypes
from metagraph.errors import ArgumentError, DTypeError, MetagraphError, ShapeError, fail
from metagraph.hooks import RemovableHandle
from metagraph import device as devices
from metagraph.device import device as _device
from metagraph.ops import autograd, index as ix, linalg, loss as ls, math as m, movement as mv
from metagraph.ops import reduce as rd, special as sp
from metagraph.ops import sorting
from metagraph.ops.node import GradMode, Node, detach
from metagraph.ops.table import apply


DEVICE_NAMES = ("cpu", "opencl", "cuda", "mps", "xpu", "hip", "meta")    # to(name): a device, not a dtype


def _unwrap(x):
    if isinstance(x, Tensor):
        return x.node
    kind = type(x)
    if kind is tuple or kind is list:          # (a list, not a generator: arguments are short)
        return kind([_unwrap(v) for v in x])
    if isinstance(x, (list, tuple)):
        return kind(_unwrap(v) for v in x)
    return x


def _wrap(x):
    if isinstance(x, Node):
        return Tensor(x)
    if isinstance(x, tuple):
        values = [_wrap(v) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else tuple(values)     # (values, indices)
    return x


def lift(fn):
    """A node-level composite as a function (or method) on Tensors."""
    @functools.wraps(fn)
    def lifted(*args, **kwargs):
        if kwargs:
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        return _wrap(fn(*map(_unwrap, args), **kwargs))
    return lifted


def _operand(other):
    """A binary operator's other operand as the ops take it (a node, a number, nested nodes)."""
    if isinstance(other, Tensor):
        return other.node
    if isinstance(other, (list, tuple)):
        return _unwrap(other)
    return other


def _operator(fn):
    """A binary operator's method: `self` is a Tensor, `other` most often a Tensor or a number, the
    result a node (lift's general wrapper costs 0.4 us more per `x + 1`, _wrap and _unwrap 0.15).
    A Tensor or a Python number is taken as it is; anything else is looked at by _operand."""
    def lifted(self, other):
        kind = type(other)
        if kind is Tensor:
            other = other.node
        elif kind is not int and kind is not float:
            other = _operand(other)
        result = fn(self.node, other)
        return Tensor(result) if type(result) is Node else _wrap(result)
    return lifted


def _reflected(fn):
    """The reflected operator's method (`1 + x`, `2 ** x`): _operator's, its operands swapped."""
    return _operator(lambda node, other: fn(other, node))


def _to_dtype(fn_dtype):
    def convert(self):
        return _wrap(m.cast(self.node, fn_dtype))
    return convert


class Tensor:
    """A lazily computed n-dimensional array."""
    __slots__ = ("node", "grad", "__weakref__")
    __array_priority__ = 1000        # numpy defers to our reflected operators

    def __init__(self, node):
        self.node = node
        self.grad = None

    # ---- inspection (sync points: numpy, item, tolist, repr) ----------------------------
    shape = property(lambda self: self.node.shape)
    dtype = property(lambda self: self.node.dtype)
    ndim = property(lambda self: self.node.ndim)
    device = property(lambda self: devices.of(self.node))
    is_leaf = property(lambda self: self.node.leaf or not self.node.requires_grad)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[mv.normalize_dim("size", self.ndim, dim)]

    def dim(self):
        return self.ndim

    def numel(self):
        return self.node.numel

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def sync(self):
        """Compute the value now; returns self."""
        backend.realize([self.node])
        return self

    def numpy(self):
        """The value as a read-only numpy array (no copy; `.copy()` it to write)."""
        backend.realize([self.node])
        view = np.asarray(self.node.buffer).view()        # (a value on a device is copied to the host)
        view.setflags(write=False)
        return view

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        if copy or (copy is None and dtype is None):
            return array.copy() if dtype is None else array.astype(dtype)
        return array if dtype is None else array.astype(dtype)

    def item(self):
        if self.numel() != 1:
            raise ArgumentError(f"item(): a tensor with {self.numel()} elements cannot be converted "
                             "to a Python scalar")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __bool__(self):
        if self.numel() != 1:
            raise MetagraphError(f"the truth value of a tensor with {self.numel()} elements is "
                               "ambiguous")
        return bool(self.item())

    __float__ = lambda self: float(self.item())  # noqa: E731
    __int__ = lambda self: int(self.item())  # noqa: E731

    def __index__(self):
        if self.dtype.is_float or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __repr__(self):
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        extra = "" if self.dtype in (dtypes.float32, dtypes.int64, dtypes.bool_) else \
            f", dtype={self.dtype!r}"
        grad = ", requires_grad=True" if self.requires_grad else ""
        place = "" if self.node.device in (None, devices.CPU_NAME) else f", device='{self.node.device}'"
        return f"tensor({body}{place}{extra}{grad})"

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    __hash__ = object.__hash__

    # ---- autograd --------------------------------------------------------------------------
    @property
    def requires_grad(self):
        return self.node.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad=True):
        """Make this tensor a leaf that does (or does not) collect gradients."""
        if requires_grad and not self.dtype.is_float:
            raise DTypeError(f"only floating-point tensors can require gradients, got "
                             f"{self.dtype.name}")
        if not requires_grad and not self.node.leaf:
            raise MetagraphError("requires_grad_(False) on a non-leaf tensor; use detach()")
        node = self.node
        leaf = Node(node.op, node.inputs, node.attrs, node.shape, node.dtype,
                    requires_grad=bool(requires_grad), buffer=node.buffer, device=node.device)
        leaf.leaf = True
        leaf.site = node.site
        leaf.owner = weakref.ref(self)
        self.node = leaf
        return self

    def clone(self):
        """A new tensor with the same value (values are immutable, so nothing is copied)."""
        return Tensor(self.node)

    def detach(self):
        """The same value, cut from autograd."""
        return Tensor(detach(self.node))

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, value):
        """Replace the value, shape and dtype included (as PyTorch's `.data =`), keeping leaf status."""
        value = value.node if isinstance(value, Tensor) else m.cast(value, self.dtype)
        self._replace(detach(value), check_leaf=False, keep_type=False)

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        """Accumulate d(self)/d(leaf) into `.grad` of every leaf that requires grad. The graph is
        released unless retain_graph (by default create_graph): walking it again raises, as in
        PyTorch, instead of adding the same gradients twice."""
        if not self.requires_grad:
            raise MetagraphError("backward(): this tensor does not require grad and has no "
                                 "history; call requires_grad_() on its inputs first")
        leaves = []
        grads = autograd.gradients([self.node], [seed_gradient("backward", self, gradient)], create_graph,
                                   retain_graph, leaves=leaves)
        for leaf in leaves:
            owner = leaf.owner() if leaf.owner is not None else None
            if owner is None or leaf.id not in grads:
                continue
            grad = Tensor(grads[leaf.id])
            owner.grad = grad if owner.grad is None else Tensor(m.add(owner.grad.node, grad.node))
        # The root's value is computed with the next realisation (the optimizer's step), as PyTorch
        # has it by now: otherwise `total = total + loss.detach()` kept every step's forward graph
        # pending, and total.item() computed them all at once (48 s after 100 steps).
        backend.defer(self)

    # ---- gradient hooks ------------------------------------------------------------------------
    def register_hook(self, hook):
        """Call hook(grad) once this tensor's gradient is computed (by backward() or mg.grad); a result
        that is not None replaces the gradient. Returns a handle whose remove() unregisters it."""
        if not self.requires_grad:
            raise MetagraphError("register_hook: cannot register a hook on a tensor that does not "
                                 "require grad")
        shape = self.shape

        def on_gradient(grad):
            replaced = hook(Tensor(grad))
            if replaced is None:
                return None
            if not isinstance(replaced, Tensor) or replaced.shape != shape:
                got = f"shape {replaced.shape}" if isinstance(replaced, Tensor) else type(replaced).__name__
                raise ShapeError(f"a gradient hook of a tensor of shape {shape} returned {got}: it "
                                 "must return None or a tensor of that shape")
            return m.cast(replaced.node, grad.dtype)
        table = autograd.grad_hooks(self.node)
        handle = RemovableHandle(table)
        table[handle.id] = on_gradient
        if "retain_grad" in table:          # as in PyTorch, .grad keeps the gradient after every hook
            table.move_to_end("retain_grad")
        return handle

    def retain_grad(self):
        """Keep this tensor's gradient in .grad after backward() (a leaf keeps its gradient anyway)."""
        if not self.requires_grad:
            raise MetagraphError("retain_grad: the tensor does not require grad")
        if self.is_leaf or self.retains_grad:
            return
        owner = weakref.ref(self)

        def keep(grad):
            tensor = owner()
            if tensor is not None:
                tensor.grad = Tensor(grad if tensor.grad is None else m.add(tensor.grad.node, grad))
        autograd.grad_hooks(self.node)["retain_grad"] = keep

    @property
    def retains_grad(self):
        return self.node.grad_hooks is not None and "retain_grad" in self.node.grad_hooks

    # ---- in-place updates -------------------------------------------------------------------
    def _replace(self, node, check_leaf=True, keep_type=True):
        """Point this tensor at a new value: every in-place update (+=, assign, copy_, setitem, ...).

        The new value is computed at the next sync point with whatever is computed there, so state
        updated in place (running statistics, counters, optimizer state) never builds a lazy chain."""
        if check_leaf and GradMode.enabled and self.node.leaf and self.node.requires_grad:
            raise MetagraphError("a leaf tensor that requires grad is used in an in-place "
                                 "operation; wrap it in metagraph.no_grad()")
        if keep_type and node.shape != self.shape:
            raise ShapeError(f"in-place result of shape {node.shape} does not fit {self.shape}")
        if keep_type and node.dtype != self.dtype:
            if node.dtype.is_float and not self.dtype.is_float:
                raise DTypeError(f"result type {node.dtype.name} can't be cast to the in-place "
                                 f"output type {self.dtype.name}")
            node = m.cast(node, self.dtype)
        if keep_type and node.device is not self.node.device and node.device is not None:
            node = backend.to_device(node, self.node.device or devices.CPU_NAME)     # (copy_ from a device)
        if self.node.leaf and self.node.requires_grad and not node.requires_grad:
            node = Node(node.op, node.inputs, node.attrs, node.shape, node.dtype,
                        requires_grad=True, buffer=node.buffer, device=node.device)
            node.leaf = True
            node.owner = weakref.ref(self)
        self.node = node
        backend.defer(self)
        return self

    def assign(self, value):
        """Jittor's in-place update: self takes value's value (no gradient through it)."""
        node = _unwrap(value) if isinstance(value, Tensor) else m.cast(value, self.dtype)
        return self._replace(detach(node), check_leaf=False)

    def copy_(self, source):
        return self._replace(mv.broadcast_to(m.cast(_unwrap(source), self.dtype), self.shape))

    def fill_(self, value):
        if isinstance(value, Tensor):
            if value.ndim:
                raise ShapeError(f"fill_: the value must be a number or a 0-d tensor, got shape "
                                 f"{value.shape}")
            return self.copy_(value)
        return self._replace(m.const(value, self.shape, self.dtype))

    def zero_(self):
        return self.fill_(0)

    def __setitem__(self, key, value):
        if isinstance(value, (list, tuple, np.ndarray)):     # array-like values, as PyTorch takes them
            from metagraph.creation import tensor            # creation builds on this module
            value = tensor(value, dtype=self.dtype)
        self._replace(ix.setitem(self.node, _unwrap(key), _unwrap(value), backend.realize))

    def __getitem__(self, key):
        return Tensor(ix.getitem(self.node, _unwrap(key), backend.realize))

    # ---- dtype ------------------------------------------------------------------------------
    def to(self, *args, dtype=None, device=None, **kwargs):
        """to(dtype), to(device), to(device, dtype) or to(other tensor): the value moved to the device
        (a copy node: metagraph/device.py) and converted; the tensor itself when neither changes."""
        for arg in args:
            if isinstance(arg, Tensor):
                dtype, device = arg.dtype, arg.device
            elif isinstance(arg, _device) or (isinstance(arg, str) and arg.partition(":")[0] in DEVICE_NAMES):
                device = arg
            else:
                dtype = arg
        node = self.node
        if device is not None:
            node = backend.to_device(node, devices.name(device))
        if dtype is not None:
            node = m.cast(node, dtypes.as_dtype(dtype))
        return self if node is self.node else Tensor(node)

    def type(self, dtype):
        return self.to(dtype)

    def type_as(self, other):
        return self.to(other.dtype)

    def cpu(self):
        """The value on the host (the tensor itself when it is there)."""
        return self.to(devices.CPU)

    float = _to_dtype(dtypes.float32)
    double = _to_dtype(dtypes.float64)
    half = _to_dtype(dtypes.float16)
    bfloat16 = _to_dtype(dtypes.bfloat16)
    int = _to_dtype(dtypes.int32)
    long = _to_dtype(dtypes.int64)
    bool = _to_dtype(dtypes.bool_)

    # ---- operators ----------------------------------------------------------------------------
    __add__, __radd__ = _operator(m.add), _reflected(m.add)
    __sub__, __rsub__ = _operator(m.sub), _reflected(m.sub)
    __mul__, __rmul__ = _operator(m.mul), _reflected(m.mul)
    __truediv__, __rtruediv__ = _operator(m.div), _reflected(m.div)
    __floordiv__, __rfloordiv__ = _operator(m.floor_divide), _reflected(m.floor_divide)
    __mod__, __rmod__ = _operator(m.remainder), _reflected(m.remainder)
    __pow__, __rpow__ = _operator(m.pow), _reflected(m.pow)
    __matmul__, __rmatmul__ = _operator(linalg.matmul), _reflected(linalg.matmul)
    __and__, __rand__ = _operator(m.bitwise_and), _reflected(m.bitwise_and)
    __or__, __ror__ = _operator(m.bitwise_or), _reflected(m.bitwise_or)
    __xor__, __rxor__ = _operator(m.bitwise_xor), _reflected(m.bitwise_xor)
    __lt__, __le__, __gt__, __ge__ = _operator(m.lt), _operator(m.le), _operator(m.gt), _operator(m.ge)
    __eq__, __ne__ = _operator(m.eq), _operator(m.ne)
    __neg__, __abs__, __invert__ = lift(m.neg), lift(m.abs_), lift(m.bitwise_not)
    __pos__ = lambda self: self  # noqa: E731

    def _inplace(fn):
        def update(self, other):
            return self._replace(fn(self.node, _unwrap(other)))
        return update

    __iadd__ = add_ = _inplace(m.add)
    __isub__ = sub_ = _inplace(m.sub)
    __imul__ = mul_ = _inplace(m.mul)
    __itruediv__ = div_ = _inplace(m.div)
    __ifloordiv__ = _inplace(m.floor_divide)
    __imod__ = _inplace(m.remainder)
    __ipow__ = pow_ = _inplace(m.pow)
    __iand__ = _inplace(m.bitwise_and)
    __ior__ = _inplace(m.bitwise_or)
    __ixor__ = _inplace(m.bitwise_xor)
    del _inplace

    def clamp_(self, min=None, max=None):
        return self._replace(m.clamp(self.node, min, max))

    def relu_(self):
        return self._replace(m.relu(self.node))

    # ---- element-wise -------------------------------------------------------------------------
    add, sub, mul, div, true_divide = lift(m.add), lift(m.sub), lift(m.mul), lift(m.div), lift(m.div)
    floor_divide, remainder, pow = lift(m.floor_divide), lift(m.remainder), lift(m.pow)
    neg, abs, reciprocal = lift(m.neg), lift(m.abs_), lift(m.recip)
    exp, exp2, log, log2 = lift(m.exp), lift(m.exp2), lift(m.log), lift(m.log2)
    sqrt, rsqrt, sin, cos, tan = lift(m.sqrt), lift(m.rsqrt), lift(m.sin), lift(m.cos), lift(m.tan)
    tanh, sigmoid, relu, erf = lift(m.tanh), lift(m.sigmoid), lift(m.relu), lift(m.erf)
    floor, ceil, round, trunc, sign = lift(m.floor), lift(m.ceil), lift(m.round), lift(m.trunc), \
        lift(m.sign)
    clamp = clip = lift(m.clamp)
    maximum, minimum = lift(m.maximum), lift(m.minimum)
    lt, le, gt, ge, eq, ne = lift(m.lt), lift(m.le), lift(m.gt), lift(m.ge), lift(m.eq), lift(m.ne)
    logical_not, logical_and = lift(m.logical_not), lift(m.logical_and)
    logical_or, logical_xor = lift(m.logical_or), lift(m.logical_xor)
    bitwise_not, bitwise_and = lift(m.bitwise_not), lift(m.bitwise_and)
    bitwise_or, bitwise_xor = lift(m.bitwise_or), lift(m.bitwise_xor)
    masked_fill = lift(ix.masked_fill)
    asin, acos, atan, atan2 = lift(sp.asin), lift(sp.acos), lift(sp.atan), lift(sp.atan2)
    arcsin, arccos, arctan, arctan2 = asin, acos, atan, atan2
    sinh, cosh, asinh, acosh, atanh = lift(sp.sinh), lift(sp.cosh), lift(sp.asinh), lift(sp.acosh), \
        lift(sp.atanh)
    expm1, log1p = lift(sp.expm1), lift(sp.log1p)
    isnan, isinf, isfinite = lift(sp.isnan), lift(sp.isinf), lift(sp.isfinite)
    isposinf, isneginf, nan_to_num = lift(sp.isposinf), lift(sp.isneginf), lift(sp.nan_to_num)
    isclose, norm = lift(sp.isclose), lift(sp.norm)
    softmax, log_softmax = lift(ls.softmax), lift(ls.log_softmax)

    def allclose(self, other, rtol=1e-5, atol=1e-8, equal_nan=False):
        """Whether every element is close to other's, as a Python bool: a sync point."""
        return Tensor(rd.all(sp.isclose(self.node, _unwrap(other), rtol, atol, equal_nan))).item()

    # ---- new tensors like this one (its dtype unless given) ------------------------------------
    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        from metagraph import creation                       # creation builds on this module
        return creation.full(size, fill_value, dtype or self.dtype, requires_grad=requires_grad,
                             device=self.device if device is None else device)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return self.new_full(size, 0, dtype, device, requires_grad)

    new_empty = new_zeros

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return self.new_full(size, 1, dtype, device, requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        from metagraph import creation
        return creation.tensor(data, dtype or self.dtype, requires_grad=requires_grad,
                               device=self.device if device is None else device)

    def square(self):
        return self * self

    def where(self, condition, other):
        """PyTorch's x.where(condition, y): x where condition else y."""
        return Tensor(m.where(_unwrap(condition), self.node, _unwrap(other)))

    # ---- reductions ---------------------------------------------------------------------------
    sum, mean, prod = lift(rd.sum), lift(rd.mean), lift(rd.prod)
    max, min, amax, amin = lift(rd.max), lift(rd.min), lift(rd.amax), lift(rd.amin)
    argmax, argmin = lift(rd.argmax), lift(rd.argmin)
    var, std, logsumexp = lift(rd.var), lift(rd.std), lift(rd.logsumexp)
    any, all = lift(rd.any), lift(rd.all)
    cumsum = lift(ix.cumsum)
    cumprod, cummax, cummin = lift(sorting.cumprod), lift(sorting.cummax), lift(sorting.cummin)
    logcumsumexp = lift(sorting.logcumsumexp)
    sort, argsort, topk = lift(sorting.sort), lift(sorting.argsort), lift(sorting.topk)

    # ---- movement -----------------------------------------------------------------------------
    reshape = view = lift(mv.reshape)
    flatten, unflatten = lift(mv.flatten), lift(mv.unflatten)
    squeeze, unsqueeze = lift(mv.squeeze), lift(mv.unsqueeze)
    permute, transpose = lift(mv.permute), lift(mv.transpose)
    expand, broadcast_to = lift(mv.expand), lift(mv.broadcast_to)
    flip, repeat, narrow = lift(mv.flip), lift(mv.repeat), lift(mv.narrow)
    split, chunk, unbind = lift(mv.split), lift(mv.chunk), lift(mv.unbind)
    tril, triu, contiguous = lift(mv.tril), lift(mv.triu), lift(mv.contiguous)
    T = property(lift(mv.T))
    mT = property(lambda self: self.transpose(-2, -1))

    def t(self):
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}")
        return self.T

    def view_as(self, other):
        return self.reshape(other.shape)

    reshape_as = view_as

    def expand_as(self, other):
        return self.expand(other.shape)

    # ---- indexing and linear algebra ------------------------------------------------------------
    gather, scatter_add = lift(ix.gather), lift(ix.scatter_add)
    index_select, index_add = lift(ix.index_select), lift(ix.index_add)
    reindex, reindex_reduce = lift(ix.reindex), lift(ix.reindex_reduce)
    matmul = mm = bmm = lift(linalg.matmul)
    scatter, scatter_reduce = lift(sorting.scatter), lift(sorting.scatter_reduce)

    def scatter_(self, dim, index, src):
        """In place: src (a tensor or a number) written at index along dim."""
        return self._replace(sorting.scatter(self.node, dim, _unwrap(index), _unwrap(src)))

    def scatter_add_(self, dim, index, src):
        return self._replace(ix.scatter_add(self.node, dim, _unwrap(index), _unwrap(src)))

    def scatter_reduce_(self, dim, index, src, reduce, include_self=True):
        return self._replace(sorting.scatter_reduce(self.node, dim, _unwrap(index), _unwrap(src), reduce,
                                                    include_self))

    def nonzero(self, as_tuple=False):
        """Indices of the non-zero elements (a sync: their count depends on the values)."""
        return _wrap(sorting.nonzero(self.node, backend.realize, as_tuple))

    def dot(self, other):
        if self.ndim != 1 or other.ndim != 1:
            raise ShapeError(f"dot: 1-D tensors expected, got {self.shape} and {other.shape}")
        return self @ other


def seed_gradient(op, output, gradient):
    """The gradient that starts reverse mode: ones for a scalar output, else the one given."""
    if gradient is None:
        if output.numel() != 1:
            raise ArgumentError(f"{op}(): grad can be implicitly created only for scalar outputs, "
                                f"got shape {output.shape}; pass the output's gradient")
        if output.node.device is None:
            return m.const(1, output.shape, output.dtype)
        seed = apply("const", value=1, shape=output.shape, dtype=output.dtype)
        seed.device = output.node.device      # (shared constants have none): the gradients are there too
        return seed
    node = gradient.node if isinstance(gradient, Tensor) else m.const(gradient, (), output.dtype)
    if node.shape != output.shape:
        node = m.expand(node, m.broadcast_shape("backward", node.shape, output.shape))
        if node.shape != output.shape:
            fail(ShapeError, "backward", f"gradient of shape {node.shape} does not match the "
                                         f"output's shape {output.shape}")
    return m.cast(node, output.dtype)
