"""Reverse-mode differentiation over the meta-op graph: every rule comes from the table.

A backward pass releases the graph it walks, as PyTorch frees its saved tensors: walking a
released node again is an error unless the first pass was given retain_graph=True. Nothing is
freed (the graph is lazy and holds no saved values); the error keeps PyTorch's contract, so that
a second backward does not silently add the same gradients again. It is stricter than PyTorch's
only for graphs that save nothing (x + 1 alone), which PyTorch lets one walk twice.

Hooks: a node may carry gradient hooks, called once its gradient is complete (Tensor.register_hook,
retain_grad), and belong to a GradGroup whose hook sees several gradients at once (a module's
backward hooks). The walk is therefore in dependency order: a node runs when its last consumer
has."""
from collections import OrderedDict

from metagraph.errors import MetagraphError, fail, user_location
from metagraph.ops import recorded_backward
from metagraph.ops.node import GradientWalk, GradMode, fresh_id
from metagraph.ops.recorded import recorded_rule
from metagraph.ops.table import TABLE

# Rules replayed per signature (ops/recorded.py), all but those that build a node or two (add passes
# its gradient on), whose key would cost more than they do, and copy's, which moves a value.
_BUILT = frozenset({"add", "mul", "neg", "cast", "contiguous", "copy"})
_RULES = {name: row.grad if name in _BUILT or row.grad is None else recorded_rule(row.grad, name)
          for name, row in TABLE.items()}


def _backward_order(outputs):
    """Nodes that need a gradient, outputs first: a depth-first walk (the last output and the last
    input first; iterative, stops at leaves) in post-order, reversed. Each node is stacked once with
    an iterator over its inputs, which resumes where it stopped when the walk comes back to it (a
    scan from the start made a cat of n inputs cost n^2: 7 s at n = 16,000)."""
    order, seen = [], set()
    for root in reversed(outputs):
        if not root.requires_grad or root.id in seen:
            continue
        seen.add(root.id)
        stack = [(root, iter(() if root.leaf else reversed(root.inputs)))]
        while stack:
            node, pending = stack[-1]
            for source in pending:
                if source.requires_grad and source.id not in seen:
                    seen.add(source.id)
                    stack.append((source, iter(() if source.leaf else reversed(source.inputs))))
                    break
            else:
                order.append(stack.pop()[0])
    return order[::-1]


def gradients(outputs, output_grads, create_graph=False, retain_graph=None, op="backward", leaves=None):
    """Map node id -> gradient node for every node between `outputs` and the leaves. The gradient
    nodes record the user's line that asked for them. Unless retain_graph (by default
    create_graph), the walked nodes are released; `op` names the caller in the error raised when
    a released node is walked again. `leaves`, a list, receives the leaf nodes that require grad
    reachable from the outputs (backward() fills their .grad)."""
    release = not (create_graph if retain_graph is None else retain_graph)
    described = recorded_backward.structure(outputs, output_grads, create_graph)
    template, recording = recorded_backward.lookup(described[0]) if described else (None, False)
    if template is not None:          # (a key with a released node has no template)
        nodes = described[1]
        grads = template.replay(nodes, user_location(), leaves)
        if release:
            template.release(nodes)
        return grads
    order = _backward_order(outputs)
    if leaves is not None:
        leaves += [node for node in order if node.leaf]
    for node in order:
        if node.released:
            fail(MetagraphError, op, "trying to backward through the graph a second time: backward() "
                                     "and grad() release the graph they walk; pass retain_graph=True "
                                     "to the first call to walk it again")
    start = fresh_id()
    previous, GradMode.enabled = GradMode.enabled, create_graph
    try:
        with GradientWalk(user_location()) as walk:
            grads = _accumulated(order, outputs, output_grads, walk)
    finally:
        GradMode.enabled = previous
    if recording:
        recorded_backward.record(*described, start, order, grads)
    if release:
        for node in order:
            node.released = not node.leaf
    return grads


class GradGroup:
    """Nodes whose gradients a hook sees together (a module's inputs, or its outputs): the walk holds
    each member once its gradient is complete until every member in the walk is, then calls
    hook(list of gradient nodes, None for a member the walk does not reach), whose result, if not
    None, replaces them. Members must not depend on one another."""
    __slots__ = ("members", "hook")

    def __init__(self, members, hook):
        self.members = list(members)
        self.hook = hook
        recorded_backward.Hooks.made = True
        for node in self.members:
            node.grad_group = self


def grad_hooks(node):
    """`node`'s gradient hooks, an ordered table to add to: each is called as hook(gradient node) once
    the node's gradient is complete, before it flows on (into a leaf's .grad, or through the node's
    rule); a result that is not None replaces the gradient."""
    if node.grad_hooks is None:
        node.grad_hooks = OrderedDict()
        recorded_backward.Hooks.made = True
    return node.grad_hooks


def _accumulated(order, outputs, output_grads, walk):
    """Each node's gradient, in an order where a node comes after every consumer in the walk (so its
    gradient is complete): its hooks run, then its rule sends the gradient on to its inputs (built
    in `walk`, a node.GradientWalk)."""
    grads = {}
    for node, grad in zip(outputs, output_grads):
        grads[node.id] = grad if node.id not in grads else grads[node.id] + grad
    pending, expected = {node.id: 0 for node in order}, {}
    for node in order:
        if not node.leaf:
            for source in node.inputs:
                if source.requires_grad:
                    pending[source.id] += 1
        if node.grad_group is not None:
            expected[node.grad_group] = expected.get(node.grad_group, 0) + 1
    held, ready = {}, []

    def complete(node):
        group = node.grad_group
        if group is None:
            ready.append(node)
            return
        members = held.setdefault(group, [])
        members.append(node)
        if len(members) == expected[group]:
            _call_group_hook(group, grads, {member.id for member in members})
            ready.extend(reversed(members))

    for node in reversed(order):
        if pending[node.id] == 0:
            complete(node)
    walked = 0
    while ready:          # (written for speed: ResNet-18's backward pass walks 1,400 nodes a step)
        node = ready.pop()
        walked += 1
        grad = grads.get(node.id)
        if grad is not None and node.grad_hooks:
            grad = grads[node.id] = _hooked(node, grad)
        if node.leaf:
            continue
        source_grads = tuple(_rule(node, grad, walk)) if grad is not None else ()
        count = len(source_grads)
        for k, source in enumerate(node.inputs):
            if not source.requires_grad:
                continue
            key = source.id
            source_grad = source_grads[k] if k < count else None
            if source_grad is not None:
                previous_grad = grads.get(key)
                grads[key] = source_grad if previous_grad is None else previous_grad + source_grad
            left = pending[key] = pending[key] - 1
            if left == 0:
                if source.grad_group is None:
                    ready.append(source)
                else:
                    complete(source)
    if walked != len(order):
        raise MetagraphError("internal: a gradient group waits on one of its own members")
    return grads


def _rule(node, grad, walk):
    """The gradients of node's inputs, as nodes that record `<node's composite>_backward`."""
    rule = _RULES[node.op]
    if rule is None:
        raise MetagraphError(f"internal: {node.op} has no gradient but requires grad")
    return walk.built(node, rule, grad)


def _hooked(node, grad):
    for hook in tuple(node.grad_hooks.values()):
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


def _call_group_hook(group, grads, walked):
    replaced = group.hook([grads.get(member.id) for member in group.members])
    if replaced is None:
        return
    for member, grad in zip(group.members, replaced):
        if member.id in walked:
            if grad is None:
                grads.pop(member.id, None)
            else:
                grads[member.id] = grad

