"""Donation: an element-wise kernel writes its output over an input that dies with it.

An optimizer step computes each parameter's (and each state buffer's) new value from the old one,
element by element. Without donation both live until the step ends: ResNet-18's SGD with momentum
held 90 MB of old values beside the new ones, and its training step peaked above PyTorch's, which
updates in place. A realised input's buffer becomes the output of the step that reads it last when
- the kernel reads it only at the output's own index and has no run-time check (lowering says so:
  `Step.in_place`, `Step.sites`: a failed check would leave neither the old value nor the new);
- it is laid out as the executor's own buffers are (shape, dtype, slack past its end) and no other
  array uses its memory (a numpy view the user took, a detached tensor sharing it);
- nothing outside this realisation can read it again: the node holding it, and each node that
  could compute from it later (a reader that will hold no buffer, or one autograd may still walk
  back through), are referred to only by this graph, as their reference counts show.
The donated node's buffer is dropped, so a wrong judgement would raise an error, not give a value.
A run that fails after a donation (a later check, out of memory, Ctrl-C) keeps every value its
finished steps computed (`keep_computed`): what reads a donated input is among them, or reads them.
Reference counts are compared with baselines measured at import through the same code, so that
the interpreter's own references (which differ between Python versions) never count.
"""
import sys
from itertools import chain

import numpy as np


def _references(table, key):
    """References to table[key], with those this call makes (as every check here makes them)."""
    value = table[key]
    return sys.getrefcount(value)


def _memory_references(table, key):
    """References to the byte array under table[key] (numpy points every view's base at it)."""
    raw = table[key].base
    return sys.getrefcount(raw)


_NODE_BASE = _references([object()], 0)                 # held once, by the graph's node list
_ARRAY_BASE = _references({0: np.empty(1)}, 0) + 1      # and by its node's buffer
_MEMORY_BASE = _memory_references({0: np.ndarray(1, np.uint8, np.empty(1, np.uint8))}, 0)   # by its array


def laid_out(buffer, node, out, slack):
    """Whether `buffer` (node's) is a host array laid out as the executor allocates `out`'s."""
    if not isinstance(buffer, np.ndarray) or buffer.base is None:    # a device's, or a user's
        return False
    raw = buffer.base
    return (buffer.flags.c_contiguous and buffer.dtype == node.dtype.np == out.dtype.np and
            buffer.shape == node.shape == out.shape and raw.nbytes == buffer.nbytes + slack and
            raw.__array_interface__["data"][0] == buffer.__array_interface__["data"][0])


def unreferenced(buffers, k, pool, slack):
    """Whether nothing but buffers[k]'s node and `buffers` refers to that array, laid out as the
    executor's own (laid_out), or to the memory under it (besides `pool`, which lent it)."""
    pooled = pool.references(buffers[k].base, slack)
    return (_references(buffers, k) <= _ARRAY_BASE and
            _memory_references(buffers, k) <= _MEMORY_BASE + pooled)


class Plan:
    """What donation needs of a schedule that does not change between its runs: which inputs each
    step may take over (it reads them last, they are not outputs, it has no run-time check), and
    who reads each position among the graph's unrealised nodes (their reads are in the key)."""

    def __init__(self, graph, steps, last, dead):
        """`last`: executor.last_uses(steps); `dead`: executor.dead_after(steps, ...)."""
        outputs = set(graph.outputs)
        self.donors = [[k for k in step.in_place if last.get(k) == i and k not in outputs]
                       if not step.sites else [] for i, step in enumerate(steps)]
        self.any = any(self.donors)
        # values autograd would keep that may go back to the pool early (Donations.unshared)
        self.releases = any(graph.nodes[k].requires_grad for positions in dead for k in positions)
        self.readers, self.slots = {}, {}
        _count_reads(graph, (k for k, node in enumerate(graph.nodes) if node.buffer is None),
                     self.readers, self.slots)
        self.outputs_of = [step.positions[0] for step in steps]
        self.roots = set(self.outputs_of)
        self.outputs = outputs


def _count_reads(graph, positions, readers, slots):
    """Add the reads of the nodes at `positions`: who reads each position, and how often."""
    position = graph.position
    for k in positions:
        for source in graph.nodes[k].inputs:
            j = position.get(source.id)
            if j is not None:
                readers.setdefault(j, []).append(k)
                slots[j] = slots.get(j, 0) + 1


class Donations:
    """One run's donations (executor.run): the plan, plus the reads of this run's realised nodes
    (autograd keeps their inputs; a graph of the same key may hold other ones), counted when first
    needed."""

    def __init__(self, graph, plan, pool, slack):
        self.graph, self.plan, self.pool, self.slack = graph, plan, pool, slack
        self.readers = self.slots = None
        self.given = False
        self.clean, self.unclean = set(), set()     # positions whose walk (below) passed, failed

    def donor(self, i, buffers):
        """The position of an input whose buffer step `i` may write its output over (its node's
        buffer is dropped; the caller drops it from `buffers` once the step has run), or None."""
        graph, plan = self.graph, self.plan
        for k in plan.donors[i]:
            if self._private(k, plan.outputs_of[i], buffers) and self.unshared(k):
                graph.nodes[k].buffer = None
                self.given = True
                return k
        return None

    def _private(self, k, out, buffers):
        """Whether the buffer of position k is laid out as the executor's own for the output at
        `out` and nothing else uses its memory. (It is never bound to a name here: that would be a
        reference the counts do not expect.)"""
        if not laid_out(buffers[k], self.graph.nodes[k], self.graph.nodes[out], self.slack):
            return False
        return unreferenced(buffers, k, self.pool, self.slack)

    def unshared(self, position):
        """Whether only this graph refers to the node at `position` and to every node that could
        compute from its value after this realisation: then nothing outside it can read that
        value again, and it may be donated, or (a value autograd would keep) go back to the pool
        once its last reader has run, as the activations a backward pass has consumed do."""
        if self.readers is None:            # the reads of this run's realised nodes
            self.readers, self.slots = {}, {}
            realised = (k for k, node in enumerate(self.graph.nodes) if node.buffer is not None)
            _count_reads(self.graph, realised, self.readers, self.slots)
        plan, nodes, stack, seen, clean = self.plan, self.graph.nodes, [position], {position}, self.clean
        while stack:
            k = stack.pop()
            slots = plan.slots.get(k, 0) + self.slots.get(k, 0)
            if k in self.unclean or _references(nodes, k) > _NODE_BASE + slots:
                self.unclean.add(k)
                return False
            for reader in chain(plan.readers.get(k, ()), self.readers.get(k, ())):
                if reader not in seen and reader not in clean and not self._final(reader):
                    seen.add(reader)
                    stack.append(reader)
        clean |= seen          # what a later walk meets here was checked, readers and all
        return True

    def _final(self, position):
        """Whether the node at `position` holds its value after this realisation and can never
        compute from its inputs again (codegen/compiled.py keeps outputs and the values autograd
        needs; autograd may walk back through a kept node that requires grad, unless a backward
        pass has released it)."""
        node = self.graph.nodes[position]
        kept = position in self.plan.outputs or (position in self.plan.roots and node.requires_grad)
        return kept and (node.leaf or not node.requires_grad or node.released)


def keep_computed(graph, buffers, finished):
    """After a run that failed: the value of each step in `finished` (their output positions) that
    is still held becomes its node's, so that nothing needs an input a donation overwrote."""
    for position in finished:
        if position in buffers and graph.nodes[position].buffer is None:
            graph.nodes[position].set_buffer(buffers[position])
