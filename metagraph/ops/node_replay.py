"""The nodes a recorded replay builds: a recorded composite's (ops/recorded.py) or a recorded backward
pass's (ops/recorded_backward.py), from steps made once per signature.

A step is (op, attrs, shape, dtype, requires_grad, leaf, signature, input positions), each node
reading earlier slots and recording the replay's site and composite, its device its inputs'; a
backward pass's steps also carry the composite and device each node records. `build(steps, slots,
site, composite)` appends one new node per step to the slots.

Setting a node's eighteen slots from Python costs about 0.35 us per node: 1.4 us of a 64^3
matmul's 2.7 us of graph building, and a ResNet-18 training step builds some 3,000 nodes by replay.
The C extension `_nodes` (built with the package where a compiler and Python's headers are found)
writes them through the slots' offsets; without it the same nodes are built here.
"""
from metagraph.extensions import load
from metagraph.ops.node import Node, _mixed_devices, next_id

# the extension, or None (recorded.py describes a call's arguments with it too)
native = load("metagraph.ops._nodes", 2, "replays build their nodes in Python")

SLOT_NAMES = ("op", "inputs", "attrs", "shape", "dtype", "site", "composite", "device", "requires_grad",
              "leaf", "buffer", "owner", "grad_hooks", "grad_group", "id", "signature", "released",
              "replayed_from")
if set(SLOT_NAMES) != set(Node.__slots__) - {"__weakref__"}:
    raise RuntimeError("ops/node_replay.py's SLOT_NAMES must name every slot of Node, in _nodes.c's order")
if native is not None:
    native.configure(Node, SLOT_NAMES, next_id, _mixed_devices)


def built_in_python(steps, slots, site, composite):
    """`build` without the extension (tests compare the two where it is built)."""
    add, replayed, new = slots.append, Node.replayed, object.__new__
    for step in steps:
        op, attrs, shape, dtype, requires_grad, leaf, signature, positions = step[:8]
        inputs = tuple([slots[k] for k in positions])
        if len(step) == 8:
            add(replayed(op, inputs, attrs, shape, dtype, requires_grad, leaf, signature, site, composite))
            continue
        node = new(Node)
        node.op, node.inputs, node.attrs, node.shape, node.dtype = op, inputs, attrs, shape, dtype
        node.site, node.composite, node.device = site, step[8], step[9]
        node.requires_grad, node.leaf, node.signature = requires_grad, leaf, signature
        node.buffer = node.owner = node.grad_hooks = node.grad_group = node.replayed_from = None
        node.id, node.released = next_id(), False
        add(node)


# what replays call: the extension's function itself where it is built (a call less per replay)
build = native.replay if native is not None else built_in_python
