"""The pending sub-graph in canonical order, with a structural key.

Two realisations whose graphs have the same structure (every training iteration) get the same
key, so the schedule built for the first is reused: hashing plus kernel calls.
"""
from dataclasses import dataclass

from metagraph.ops.node import signature as node_signature


@dataclass
class PendingGraph:
    nodes: list          # inputs first; realised nodes appear as leaves
    outputs: list        # positions of the requested nodes in `nodes`
    key: tuple           # equal for structurally equal graphs
    position: dict       # node id -> position in `nodes`


def pending_graph(outputs):
    """Walk from the outputs down to realised buffers (iteratively: graphs can be deep). Runs at
    every realisation: written for speed (no generators in the loop)."""
    position, nodes, signature = {}, [], []
    stack = [(node, False) for node in reversed(outputs)]
    pop, push = stack.pop, stack.append
    while stack:
        node, expanded = pop()
        if node.id in position:
            continue
        if node.buffer is not None and node.op != "const":   # a realised constant stays a constant
            position[node.id] = len(nodes)
            nodes.append(node)
            signature.append(("buffer", node.shape, node.dtype))
            continue
        inputs = node.inputs
        if not expanded:
            push((node, True))
            for source in reversed(inputs):
                if source.id not in position:
                    push((source, False))
            continue
        position[node.id] = len(nodes)
        nodes.append(node)
        signature.append((node.signature or node_signature(node),
                          tuple([position[source.id] for source in inputs])))
    output_positions = [position[node.id] for node in outputs]
    return PendingGraph(nodes, output_positions, (tuple(signature), tuple(output_positions)), position)
