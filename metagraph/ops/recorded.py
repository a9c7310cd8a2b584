"""Composites recorded once per argument signature and replayed: an eager call's Python cost.

A composite (softmax, conv2d, a loss) builds the same nodes whenever its node arguments have the
same shapes, dtypes and requires_grad flags and its other arguments are equal (and grad mode and
autocast's state are the same): it never reads a value. The first call with a signature runs the
composite and records the nodes it built, in order, as a template. Later calls create those nodes
directly, without running broadcasting, promotion and the shape checks again (they passed for this
signature). A softmax over a 4096x1024 tensor builds its graph in a quarter of the time warm, half
with cold caches.

A composite is only recorded when replaying it is provably the same as calling it: every node it
built was built during the call, from its arguments, from constants or from each other, and none
holds a value. A call that reads anything else (a buffer, a node it did not receive)
is called again every time.

Templates not used since the last sweep of their table go at the next (ops/stale.py).
"""
import functools
from operator import itemgetter

from metagraph.amp.autocast import AutocastMode
from metagraph.dtypes import DType
from metagraph.ops.node import GradMode, Node, built_as, fresh_id, replay_context, signature
from metagraph.ops.node_replay import build, native
from metagraph.ops.stale import Sweep

TEMPLATE_CACHE_SIZE = 8192       # templates at most, the oldest dropped first (a bound, not a policy)
_TEMPLATES = {}        # call signature -> Template, or _CALL when the composite must be called
_CALL = object()
_SWEEP = Sweep(128)


class _Unkeyable(Exception):
    """An argument the call signature cannot describe (the composite is then just called)."""


def recorded(composite):
    """`composite`, recorded per call signature and replayed (see the module docstring)."""
    @functools.wraps(composite)
    def call(*args, **kwargs):
        nodes = []
        try:
            key = (composite, _arguments(args, nodes), GradMode.enabled, AutocastMode.dtype)
            if kwargs:
                key += (_describe(kwargs, nodes),)
        except _Unkeyable:
            return built_as(composite.__name__, composite, args, kwargs)
        template = _TEMPLATES.get(key)
        if template is _CALL:
            return built_as(composite.__name__, composite, args, kwargs)
        if template is not None:
            return template.replay(nodes)
        start = fresh_id()
        result = built_as(composite.__name__, composite, args, kwargs)
        _remember(key, _record(result, nodes, start, composite.__name__))
        return result
    return call


def recorded_rule(rule, name):
    """`rule(grad, y, *inputs)`, the gradient rule of table row `name`, recorded and replayed as a
    composite is. Its nodes follow from y's signature (its op and attributes: a reindex's map), the
    incoming gradient's (a rule may look at how the gradient was made: `table._shifted_scatter`),
    the shapes, dtypes and requires_grad flags of all of them, and grad mode. A rule that reads a
    node it was not given (the scatter inside that gradient) is called every time, as `_record`
    says. ResNet-18's backward pass runs 650 rules a step; building the views' gradients (inverse
    maps, index checks) was most of its Python time."""
    @functools.wraps(rule)
    def call(grad, y, *inputs):
        nodes = [grad]
        described = [(grad.requires_grad,)]        # (its shape and dtype are in its signature)
        for node in (y,) + inputs:                  # _describe's for nodes, flat
            for k, seen in enumerate(nodes):
                if seen is node:
                    described.append(k)
                    break
            else:
                nodes.append(node)
                described.append((node.shape, node.dtype, node.requires_grad))
        key = (rule, y.signature or signature(y), grad.signature or signature(grad), *described,
               GradMode.enabled, AutocastMode.dtype)
        template = _TEMPLATES.get(key)
        if template is _CALL:
            return rule(grad, y, *inputs)
        if template is not None:
            return template.replay(nodes)
        start = fresh_id()
        result = rule(grad, y, *inputs)
        _remember(key, _record(result, nodes, start, name))
        return result
    return call


def _remember(key, template):
    """Put a new template in the table, first sweeping out the stale ones when it is due."""
    if _SWEEP.due():       # (a call that cannot be recorded goes too, and is tried again: cheap)
        _SWEEP.prune(_TEMPLATES, lambda t: None if t is _CALL else t.used)
    if len(_TEMPLATES) >= TEMPLATE_CACHE_SIZE:
        _TEMPLATES.pop(next(iter(_TEMPLATES)))
    if template is not _CALL:
        template.used = _SWEEP.generation
    _TEMPLATES[key] = template


_ITSELF = frozenset({int, str, type(None), DType})      # the arguments that describe themselves


def _arguments_in_python(args, nodes):
    """_describe of a call's positional arguments, most often nodes, described here without a call
    per argument (a third of a small composite's key). The C extension's `arguments` does the same
    where it is built (node_replay.py): 0.3 -> 0.15 us for two nodes."""
    described = []
    for value in args:
        if type(value) is Node:
            for k, seen in enumerate(nodes):
                if seen is value:
                    described.append((Node, k))
                    break
            else:
                nodes.append(value)
                described.append((value.shape, value.dtype, value.requires_grad))
        else:
            described.append(value if type(value) in _ITSELF else _describe(value, nodes))
    return tuple(described)


def _describe(value, nodes):
    """A hashable description of an argument. Node arguments are appended to `nodes` and
    described by shape, dtype and requires_grad, or by the position of an earlier argument that
    is the same node (f(x, x) builds a different graph from f(x, y)). Ints, strings and None
    stand for themselves; floats are told apart by their bits (-0.0 from 0.0; nan equals
    itself), and floats and bools from ints (1 == 1.0 == True in Python)."""
    kind = type(value)
    if kind is Node:
        for k, seen in enumerate(nodes):
            if seen is value:
                return (Node, k)
        nodes.append(value)
        return (value.shape, value.dtype, value.requires_grad)
    if kind is int or kind is str or value is None or kind is DType:     # one object per DType
        return value
    if kind is float:
        return (float, value.hex())
    if kind is bool:
        return (bool, value)
    if kind is tuple or kind is list:     # (ints, strings and None inline: most of what they hold)
        return (kind, *[v if type(v) in _ITSELF else _describe(v, nodes) for v in value])
    if kind is dict:
        return (dict, *[(k, _describe(v, nodes)) for k, v in sorted(value.items())])
    raise _Unkeyable()


_arguments = (functools.partial(native.arguments, tuple(_ITSELF), _describe) if native is not None
              else _arguments_in_python)


class Template:
    """The nodes one call of composite `name` built, in creation order, each reading earlier
    slots: the call's node arguments first, then the constants it read, then the nodes built
    before it."""

    def __init__(self, steps, constants, result, name, arguments):
        self.steps = steps            # made_since's (each node's composite and device unused)
        self.built = tuple(step[:8] for step in steps)      # what node_replay builds from
        self.constants = constants
        self.result = result          # the composite's result with slot numbers in place of nodes
        self.fill = _filler(result)   # fill(slots): the result of a replay
        self.name = name
        self.used = _SWEEP.generation      # the sweep generation it was last replayed in
        self.arguments = arguments         # how many node arguments a call has
        # a result that is one node the call built records the replay that made it (the template
        # and its slots but itself): what the graph below it is, without a walk (compiler/graph.py).
        # Not one autograd walks: its slots would keep what the backward pass frees.
        first = arguments + len(constants)
        self.single = type(result) is int and result >= first and not steps[result - first][4]
        self.walk = None              # compiler/graph.py's record of that walk, made once

    def replay(self, arguments):
        """The nodes rebuilt from the call's node arguments, a list the slots are appended to. They
        record the composite a call would (this one, or the one outside it being built)."""
        self.used = _SWEEP.generation
        location, composite = replay_context(self.name)
        slots = arguments
        slots += self.constants
        build(self.built, slots, location, composite)
        if self.single:     # (its slots without it: a node holding itself would wait for the GC)
            result = slots.pop(self.result)
            result.replayed_from = (self, slots)
            return result
        return self.fill(slots)


def _record(result, arguments, start, name):
    """The Template of a call of composite `name` that began when node ids reached `start`, or
    _CALL."""
    made = made_since(result, arguments, start)
    return _CALL if made is _CALL else Template(*made, name, len(arguments))


def made_since(result, arguments, start):
    """(steps, constants, result with slot numbers in place of nodes) of the nodes reached from
    `result` that were built since node ids reached `start`, in creation order, each step
    (op, attrs, shape, dtype, requires_grad, leaf, signature, input slots, composite, device); slots are
    the `arguments` (nodes), then the constants read, then the built nodes. _CALL when a node
    reached is none of these (or the result is not nodes in tuples and lists), or holds a value."""
    slot = {id(node): k for k, node in enumerate(arguments)}
    built, constants, stack = {}, [], []
    try:
        structure = _slotted(result, stack)
    except _Unkeyable:
        return _CALL
    while stack:
        node = stack.pop()
        if id(node) in slot or node.id in built:
            continue
        # a constant, even one made in this call (most are the shared constants of math.const,
        # which later calls and other code read too: a replay reads the same node, as they do)
        if node.op == "const" and not node.inputs:
            slot[id(node)] = len(arguments) + len(constants)
            constants.append(node)
            continue
        if node.id < start:           # not built by this call
            return _CALL
        if node.buffer is not None:   # a value: a replay would not recompute it
            return _CALL
        built[node.id] = node
        stack.extend(node.inputs)
    first = len(arguments) + len(constants)
    order = sorted(built.values(), key=lambda node: node.id)   # inputs are built before readers
    slot.update((id(node), first + k) for k, node in enumerate(order))
    steps = tuple((node.op, node.attrs, node.shape, node.dtype, node.requires_grad, node.leaf,
                   signature(node), tuple([slot[id(source)] for source in node.inputs]),
                   node.composite, node.device)
                  for node in order)
    return steps, constants, _numbered(structure, slot)


def _slotted(result, stack):
    """The result's structure (nodes, None, tuples and lists of them), its nodes pushed on
    `stack`; raises _Unkeyable for anything else."""
    if type(result) is Node:
        stack.append(result)
        return result
    if result is None:
        return None
    if type(result) in (tuple, list):
        return type(result)(_slotted(v, stack) for v in result)
    raise _Unkeyable()


def _numbered(result, slot):
    if type(result) is Node:
        return slot[id(result)]
    if result is None:
        return None
    return type(result)(_numbered(v, slot) for v in result)


def _filler(result):
    """fill(slots): `result` (from _numbered) with the slots' nodes in place of slot numbers. A slot
    number, or a flat tuple of them and Nones (a gradient rule's gradients), is filled without
    walking its structure (a walk per replay was a tenth of a backward pass's Python)."""
    if type(result) is int:
        return itemgetter(result)
    if type(result) is tuple and all(type(v) is int or v is None for v in result):
        slots_of = tuple(result)
        return lambda slots: tuple([None if k is None else slots[k] for k in slots_of])
    return lambda slots: _filled(result, slots)


def _filled(result, slots):
    if type(result) is int:
        return slots[result]
    if result is None:
        return None
    return type(result)(_filled(v, slots) for v in result)
