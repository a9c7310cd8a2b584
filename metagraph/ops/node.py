"""The lazy graph node: what every Tensor points at.

A node is a meta-op applied to input nodes. It records its shape, dtype and the user's
file:line. Nothing is computed until a backend realises it; then `buffer` holds the data and,
unless autograd still needs its history, the node forgets its inputs and becomes a `buffer` leaf.
"""
import contextvars
import itertools
import sys
from contextlib import contextmanager
from operator import itemgetter

from metagraph.errors import _PACKAGE_DIR, PROGRAM_FILES, DeviceError, at
from metagraph.ops.stale import Sweep


class GradMode:
    """Whether new nodes record autograd history (off inside `no_grad()`)."""
    enabled = True


_ids = itertools.count()
next_id = _ids.__next__          # a new node's id (a call with no Python frame)
_new = object.__new__


# Per thread (and asyncio task): None, or (where the nodes being built now are created, if known,
# the outermost composite being built: cross_entropy, not the gather inside it): a tuple, or a
# backward pass's list (GradientWalk), which only that pass changes. One value, so that a
# node built outside both (an eager `a + 1`) reads it once; a context variable, whose bound get()
# costs 13 ns where a threading.local's attribute costs 40. Restored by value, not by token (a
# token may not be reset in another context).
_building = contextvars.ContextVar("metagraph_building", default=None)
_building_now = _building.get


def labelled(node, own):
    """`node` (a checked reindex), whose run-time errors name the outermost composite being built
    (every node records it: cross_entropy, not the gather inside it), else `own`, its caller's
    name, rather than its table op."""
    if node.composite is None:
        node.composite = own
    return node


_GRADIENT_NAMES = {}       # a composite's (or op's) name -> the name its gradient rules' nodes record


class GradientWalk:
    """The building context of a backward pass (`with GradientWalk(line) as walk:`): its nodes
    record the user's line, and each gradient rule's (`walk.built`) the composite `<forward
    composite>_backward` (`conv2d_backward`), which profiles name the backward pass's kernels by.
    One mutable context for the whole walk, renamed per rule: setting the context variable twice
    per rule made and dropped a context mapping each time (W12's backward pass runs 6,000 rules)."""
    __slots__ = ("context", "outer")

    def __init__(self, location):
        self.context = [location, None]
        self.outer = None

    def __enter__(self):
        self.outer = _building_now()
        if self.outer is not None:
            self.context[1] = self.outer[1]
        _building.set(self.context)
        return self

    def __exit__(self, *failure):
        _building.set(self.outer)

    def built(self, node, rule, grad):
        """rule(grad, node, *node.inputs), its nodes recording `<node's composite>_backward`."""
        forward = node.composite or node.op
        name = _GRADIENT_NAMES.get(forward)
        if name is None:
            name = _GRADIENT_NAMES[forward] = forward + "_backward"
        context = self.context
        outer, context[1] = context[1], name
        try:
            return rule(grad, node, *node.inputs)
        finally:
            context[1] = outer


def built_as(name, composite, args, kwargs):
    """composite(*args, **kwargs), whose nodes record the composite `name` (what profiles and
    run-time errors name) unless a composite outside it is being built already."""
    outer = _building_now()
    if outer is not None and outer[1] is not None:
        return composite(*args, **kwargs)
    _building.set((None if outer is None else outer[0], name))
    try:
        return composite(*args, **kwargs)
    finally:
        _building.set(outer)


def building_composite():
    """The outermost composite being built now (the one a node built now records), or None."""
    context = _building_now()
    return None if context is None else context[1]


def reported_op(node):
    """The op a run-time error of `node` names: the composite that built it, if any."""
    return getattr(node, "composite", None) or node.op


def replay_context(name):
    """(where a node built now is created: the user's line as a site, see `user_site`, or the one
    located() gives; the outermost composite being built, else `name`), for composite `name`
    replaying its nodes: one read of the building context per replay."""
    context = _building_now()
    if context is None:
        return user_site(sys._getframe(2)), name   # past this function and its caller
    return context[0] or user_site(sys._getframe(2)), context[1] or name


_PACKAGE_FILES = set()     # the file names of the package's code met so far (not PROGRAM_FILES)


def user_site(frame):
    """The innermost frame outside the metagraph package from `frame` out, as (code, offset), which
    Node.location turns into (file, line) when asked. Asked at every new node, and a frame's
    f_lineno scans its code's line table from the start: 3 us per node at the end of a 600-line
    script's module-level code, where training loops live. A file name test per frame (a set
    lookup, cheaper than the str method), never a set of code objects (hashing a code object
    hashes its bytecode and constants)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name not in _PACKAGE_FILES:
            if not name.startswith(_PACKAGE_DIR) or name in PROGRAM_FILES:
                break
            _PACKAGE_FILES.add(name)
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code, frame.f_lasti)


def file_and_line(site):
    """(file, line) of a site from user_site."""
    code, offset = site
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return (code.co_filename, line)
    return (code.co_filename, code.co_firstlineno)


@contextmanager
def located(location):
    """Nodes built inside record `location` rather than each walking the stack to find it (the
    backward pass and an optimizer's step build thousands of nodes from one user line)."""
    outer = _building_now()
    _building.set((location, None if outer is None else outer[1]))
    try:
        yield
    finally:
        _building.set(outer)


def _mixed_devices(op, device, other, node):
    raise DeviceError(f"{op}: its operands are on different devices, {device} and {other}; move one with "
                      f".to() (at {at(node.location)})")


class Node:
    """One meta-op application in the lazy graph."""
    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "site", "requires_grad", "leaf",
                 "buffer", "owner", "id", "signature", "released", "composite",
                 "grad_hooks", "grad_group", "device", "replayed_from",
                 "__weakref__")

    def __init__(self, op, inputs, attrs, shape, dtype, requires_grad=None, buffer=None, location=None,
                 composite=None, device=None):
        if type(inputs) is not tuple:
            inputs = tuple(inputs)
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.dtype = dtype
        # where the user created it: `location`, the one located() gives, or the user's frame
        # (inlined current_location: this runs for every node); and the outermost composite
        # building it (conv2d, not the reindex inside it), or None: what profiles and errors name.
        # A replay gives both, and reads no context.
        if location is None:
            context = _building_now()
            if context is None:
                self.site = user_site(sys._getframe(1))
            else:
                self.site = context[0] or user_site(sys._getframe(1))
                composite = composite or context[1]
        else:
            self.site = location
        self.composite = composite
        # the device its value lives on ("cpu", "opencl": metagraph.device's names), that of its
        # inputs unless given; None for a constant or a table built on the host, which goes with
        # whatever reads it (and is computed on the CPU when nothing does). Whether it requires
        # grad: whether an input does, unless given. One walk over the inputs for both.
        if device is None or requires_grad is None:
            given, grad = device, False
            for source in inputs:
                other = source.device
                if other is not None and other is not device and given is None:
                    if device is not None:
                        _mixed_devices(composite or op, device, other, self)
                    device = other
                if source.requires_grad:
                    grad = True
            if requires_grad is None:
                requires_grad = grad and GradMode.enabled and dtype.is_float
        self.device = device
        self.requires_grad = requires_grad
        self.leaf = not inputs           # autograd stops at leaves
        self.buffer = buffer
        self.owner = None                # weak reference to the leaf Tensor that owns this node
        self.id = next(_ids)
        self.signature = None            # signature(self), computed once when needed
        self.released = False            # a backward pass walked it without retain_graph
        self.grad_hooks = None           # gradient hooks (ops/autograd.py), rarely any
        self.grad_group = None           # a GradGroup this node's gradient waits with
        self.replayed_from = None        # (Template, its slots) when a recorded call's replay made it

    @staticmethod
    def replayed(op, inputs, attrs, shape, dtype, requires_grad, leaf, signature, site, composite):
        """A node as __init__ builds it from checked parts (a recorded composite's replay: a tuple of
        inputs, a tuple shape, its autograd flags, leaf status and signature known), without the
        checks and defaults: 0.2 us, 0.3 through __init__. Its device is still its inputs'."""
        node = _new(Node)
        node.op, node.inputs, node.attrs, node.shape, node.dtype = op, inputs, attrs, shape, dtype
        node.site, node.composite = site, composite
        device = None
        for source in inputs:
            other = source.device
            if other is not None and other is not device:
                if device is not None:
                    _mixed_devices(composite or op, device, other, node)
                device = other
        node.device, node.requires_grad, node.leaf = device, requires_grad, leaf
        node.buffer = node.owner = node.grad_hooks = node.grad_group = node.replayed_from = None
        node.id, node.signature, node.released = next(_ids), signature, False
        return node

    @property
    def location(self):
        """(file, line) of the user's code that created this node."""
        site = self.site
        if type(site[0]) is not str:
            site = self.site = file_and_line(site)
        return site

    def __getstate__(self):
        """The state to pickle or copy, its site a (file, line): code objects do not pickle (nor
        does a replay's template, a cache)."""
        self.site = self.location
        self.replayed_from = None
        return super().__getstate__()

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def numel(self):
        count = 1
        for size in self.shape:
            count *= size
        return count

    def set_buffer(self, array):
        """Store the realised value; drop the history unless autograd may still walk it."""
        self.buffer = array
        self.replayed_from = None
        if self.op == "const":      # stays a constant in later graphs (constants are shared nodes)
            return
        if self.leaf or not self.requires_grad:
            self.op, self.inputs, self.attrs, self.leaf = "buffer", (), {}, True

    def __repr__(self):
        return f"<{self.op} {self.shape} {self.dtype.name}>"

    # Arithmetic for readable gradient rules and composites (`-g * y * y`); these build
    # composites, which broadcast and promote as Tensor does.
    def __add__(self, other):
        return _math().add(self, other)

    def __radd__(self, other):
        return _math().add(other, self)

    def __sub__(self, other):
        return _math().sub(self, other)

    def __rsub__(self, other):
        return _math().sub(other, self)

    def __mul__(self, other):
        return _math().mul(self, other)

    def __rmul__(self, other):
        return _math().mul(other, self)

    def __truediv__(self, other):
        return _math().div(self, other)

    def __rtruediv__(self, other):
        return _math().div(other, self)

    def __neg__(self):
        return _math().neg(self)


def fresh_id():
    """An id no node has: nodes built before it have smaller ids, nodes built after larger ones."""
    return next(_ids)


_SIGNATURES = {}    # (op, attrs, shape, dtype) -> [its number, the sweep generation it was last looked up in]
_signature_numbers = itertools.count(1)      # 0 would read as "not computed yet"
SIGNATURE_TABLE_SIZE = 1 << 16               # a bound (the oldest dropped first), not the policy: _SWEEP
_SWEEP = Sweep(1024)


def signature(node):
    """A number for (op, attrs, shape, dtype), equal for nodes that compute alike from alike
    inputs; graph keys made of numbers hash fast. Computed once per node. Numbers are never
    reused: a signature dropped from the table (ops/stale.py; a template's nodes carry theirs
    without a look-up) gets a new one when it comes back."""
    if node.signature is None:
        attrs = node.attrs
        if attrs:          # most nodes (element-wise) have none: no sort, no generator
            attrs = tuple(sorted([(k, _comparable(v)) for k, v in attrs.items()]))
        described = (node.op, attrs or (), node.shape, node.dtype)
        entry = _SIGNATURES.get(described)
        if entry is None:
            _make_room()
            entry = _SIGNATURES[described] = [next(_signature_numbers), 0]
        entry[1] = _SWEEP.generation
        node.signature = entry[0]
    return node.signature


def _make_room():
    """Sweep the signatures not looked up since the last sweep when it is due; keep the bound."""
    if _SWEEP.due():
        _SWEEP.prune(_SIGNATURES, itemgetter(1))
    if len(_SIGNATURES) >= SIGNATURE_TABLE_SIZE:
        _SIGNATURES.pop(next(iter(_SIGNATURES)))


def _comparable(value):
    """An attribute as a dictionary key: lists as tuples, and floats by their bits (a kernel made
    for x * 0.0 must not serve x * -0.0, and a constant nan must find its schedule again)."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, float):
        return (float, value.hex())
    return value


def _math():
    """metagraph.ops.math, which builds on this module (imported once: an import statement per
    node arithmetic call cost more than the call)."""
    global _MATH
    if _MATH is None:
        from metagraph.ops import math
        _MATH = math
    return _MATH


_MATH = None


def detach(node):
    """The same value, cut from autograd (a copy of the node that does not require grad)."""
    if not node.requires_grad:
        return node
    copy = Node(node.op, node.inputs, node.attrs, node.shape, node.dtype, requires_grad=False,
                buffer=node.buffer, composite=node.composite, device=node.device)
    copy.leaf = True
    return copy
