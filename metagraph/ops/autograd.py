"""Reverse-mode differentiation over the meta-op graph: every rule comes from the table."""
from metagraph.errors import MetagraphError, user_location
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


def gradients(outputs, output_grads, create_graph=False):
    """Map node id -> gradient node for every node between `outputs` and the leaves. The gradient
    nodes record the user's line that asked for them."""
    previous, GradMode.enabled = GradMode.enabled, create_graph
    try:
        with located(user_location()):
            return _accumulated(outputs, output_grads)
    finally:
        GradMode.enabled = previous


def _accumulated(outputs, output_grads):
    grads = {}
    for node, grad in zip(outputs, output_grads):
        grads[node.id] = grad if node.id not in grads else grads[node.id] + grad
    for node in _backward_order(outputs):
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
