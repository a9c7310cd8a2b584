"""Reverse-mode differentiation over the meta-op graph: every rule comes from the table.

A backward pass releases the graph it walks, as PyTorch frees its saved tensors: walking a
released node again is an error unless the first pass was given retain_graph=True. Nothing is
freed (the graph is lazy and holds no saved values); the error keeps PyTorch's contract, so that
a second backward does not silently add the same gradients again. It is stricter than PyTorch's
only for graphs that save nothing (x + 1 alone), which PyTorch lets one walk twice."""
from metagraph.errors import MetagraphError, fail, user_location
from metagraph.ops.node import GradMode, located
from metagraph.ops.table import TABLE


def _backward_order(outputs):
    """Nodes that need a gradient, outputs first (iterative; stops at leaves)."""
    order, seen, stack = [], set(), [(node, False) for node in outputs if node.requires_grad]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node.id in seen:
            continue
        seen.add(node.id)
        stack.append((node, True))
        if not node.leaf:
            stack.extend((source, False) for source in node.inputs
                         if source.requires_grad and source.id not in seen)
    return order[::-1]


def gradients(outputs, output_grads, create_graph=False, retain_graph=None, op="backward"):
    """Map node id -> gradient node for every node between `outputs` and the leaves. The gradient
    nodes record the user's line that asked for them. Unless retain_graph (by default
    create_graph), the walked nodes are released; `op` names the caller in the error raised when
    a released node is walked again."""
    order = _backward_order(outputs)
    for node in order:
        if node.released:
            fail(MetagraphError, op, "trying to backward through the graph a second time: backward() "
                                     "and grad() release the graph they walk; pass retain_graph=True "
                                     "to the first call to walk it again")
    previous, GradMode.enabled = GradMode.enabled, create_graph
    try:
        with located(user_location()):
            grads = _accumulated(order, outputs, output_grads)
    finally:
        GradMode.enabled = previous
    if not (create_graph if retain_graph is None else retain_graph):
        for node in order:
            node.released = not node.leaf
    return grads


def _accumulated(order, outputs, output_grads):
    grads = {}
    for node, grad in zip(outputs, output_grads):
        grads[node.id] = grad if node.id not in grads else grads[node.id] + grad
    for node in order:
        grad = grads.get(node.id)
        if grad is None or node.leaf:
            continue
        rule = TABLE[node.op].grad
        if rule is None:
            raise MetagraphError(f"internal: {node.op} has no gradient but requires grad")
        for source, source_grad in zip(node.inputs, rule(grad, node, *node.inputs)):
            if source_grad is None or not source.requires_grad:
                continue
            previous_grad = grads.get(source.id)
            grads[source.id] = source_grad if previous_grad is None else previous_grad + source_grad
    return grads


def leaves(outputs):
    """The leaf nodes that require grad, reachable from outputs."""
    return [node for node in _backward_order(outputs) if node.leaf]
