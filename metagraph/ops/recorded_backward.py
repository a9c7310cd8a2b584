"""A backward pass recorded per graph structure and replayed: a training loop's per-step Python.

A training loop builds a forward graph of the same structure every step, so its backward pass
builds the same gradient nodes every step. Which nodes the rules build follows from what they read:
the signature (op, attributes, shape, dtype), autograd flags and inputs of the nodes they are given
and of the nodes those were built from (a window's gradient looks two nodes down), the output
gradients, grad mode (create_graph), autocast's dtype and the default float dtype. The key is
therefore the whole graph reachable from the outputs and their gradients, every node with its
signature, requires_grad, leaf and released flags, composite name (what its gradient's nodes
record), device (what theirs is) and inputs by number (first met, first numbered), and those
settings.

A structure's first walk is only keyed (a graph seen once, as in tests or a model whose graph
changes, pays the key alone); its second walk is recorded, as recorded.py records a composite:
the nodes reached from the gradients it built, each reading earlier slots (the graph's nodes by
number, then constants, then built nodes); later walks of the structure replay them. A walk is
recorded only when its replay is provably the same graph: every node it reaches was built by the
walk, is a constant or is in the keyed graph, and none holds a value or moves one to a device
(`copy`). A graph with gradient hooks or grad groups (user code, called as the walk goes) is walked
every time, and so is one whose recording failed.
"""
from metagraph import dtypes
from metagraph.amp.autocast import AutocastMode
from metagraph.ops.node import building_composite, signature
from metagraph.ops.node_replay import build
from metagraph.ops.recorded import _CALL, made_since

TEMPLATE_CACHE_SIZE = 32         # a template holds a step per gradient node (ResNet-18: 1,100)
SEEN_CACHE_SIZE = 1024
_TEMPLATES = {}      # hash of a key -> (key, Walk or _CALL)
_SEEN = {}           # hashes of the keys walked once


class Hooks:
    """Whether any node was ever given gradient hooks or a grad group (autograd sets it): until then
    structure() need not look for them."""
    made = False


def structure(outputs, output_grads, create_graph):
    """(key, nodes) of a backward pass from `outputs` with gradients `output_grads`: the key and the
    graph's nodes in the key's numbering. None when a node has gradient hooks or is in a grad group.
    (Written for speed: ResNet-18's step keys 870 nodes, 0.3 us each; a node's entry is its
    signature, a tuple of its flags and its inputs' numbers.)"""
    numbers, nodes = {}, []
    key = [create_graph, AutocastMode.dtype, dtypes.default_float, building_composite()]
    for root in (*outputs, *output_grads):
        number = numbers.get(root.id)
        if number is None:
            number = numbers[root.id] = len(nodes)
            nodes.append(root)
        key.append(number)
    add, get, place, hooks = key.append, numbers.get, nodes.append, Hooks.made
    for node in nodes:           # (the list grows as the loop goes: a walk in order of numbering)
        if hooks and (node.grad_hooks is not None or node.grad_group is not None):
            return None
        inputs = node.inputs
        if inputs:
            add(node.signature or signature(node))
            add((node.requires_grad, node.leaf, node.released, node.composite, node.device, len(inputs)))
            for source in inputs:
                number = get(source.id)
                if number is None:
                    number = numbers[source.id] = len(nodes)
                    place(source)
                add(number)
        else:
            # (a realised node keeps the signature it had before it became a buffer)
            add(("buffer", node.shape, node.dtype) if node.op == "buffer" else
                node.signature or signature(node))
            add((node.requires_grad, node.released, node.device))
    return tuple(key), nodes


def lookup(key):
    """(the Walk to replay or None, whether to record this walk) for `key` from structure()."""
    fingerprint = hash(key)
    found = _TEMPLATES.get(fingerprint)
    if found is not None and found[0] == key:
        _TEMPLATES[fingerprint] = _TEMPLATES.pop(fingerprint)      # the least recently used go first
        return (None if found[1] is _CALL else found[1]), False
    if fingerprint in _SEEN:
        return None, True
    if len(_SEEN) >= SEEN_CACHE_SIZE:
        _SEEN.pop(next(iter(_SEEN)))
    _SEEN[fingerprint] = None
    return None, False


def record(key, nodes, start, order, grads):
    """Remember the walk that began when node ids reached `start` over the graph `nodes` (in key
    order), which gave `grads` (node id -> gradient node) for `order` (the walk's nodes)."""
    number = {node.id: k for k, node in enumerate(nodes)}
    made = made_since(tuple(grads.values()), nodes, start)
    if made is not _CALL and any(step[0] == "copy" for step in made[0]):    # (a move: see module)
        made = _CALL
    if made is not _CALL:
        steps, constants, result = made
        made = Walk(steps, constants, tuple(zip([number[walked] for walked in grads], result)),
                    tuple([number[node.id] for node in order if node.leaf]),
                    tuple([number[node.id] for node in order if not node.leaf]))
    fingerprint = hash(key)
    _SEEN.pop(fingerprint, None)
    if len(_TEMPLATES) >= TEMPLATE_CACHE_SIZE:
        _TEMPLATES.pop(next(iter(_TEMPLATES)))
    _TEMPLATES[fingerprint] = (key, made)


class Walk:
    """A recorded backward pass: the gradient nodes it built (recorded.made_since's steps, with the
    composite and device each recorded), each gradient it gave (the node's number, the gradient's
    slot, in the walk's order), the numbers of the leaves it reached and of the nodes it released
    unless retain_graph."""
    __slots__ = ("steps", "constants", "gradients", "leaves", "walked")

    def __init__(self, steps, constants, gradients, leaves, walked):
        self.steps, self.constants, self.gradients = steps, constants, gradients
        self.leaves, self.walked = leaves, walked

    def replay(self, nodes, location, leaves):
        """The walk's gradients (node id -> gradient node) rebuilt over the graph's `nodes` (from
        structure(); the slots are appended to it), every node recording `location`; `leaves`, a
        list or None, receives the leaves reached, as the walk's. Each node records the device
        its step recorded, which follows from the key's (node_replay.py)."""
        slots = nodes
        slots += self.constants
        build(self.steps, slots, location, None)
        if leaves is not None:
            leaves += [slots[k] for k in self.leaves]
        return {slots[node].id: slots[grad] for node, grad in self.gradients}

    def release(self, nodes):
        """Mark the walked nodes released, as the walk does without retain_graph."""
        for k in self.walked:
            nodes[k].released = True
