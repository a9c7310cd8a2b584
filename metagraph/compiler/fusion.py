"""Fusion: which nodes of the pending graph are materialised; everything else is inlined.

The rules, in the order they apply:
- requested outputs, `reduce`, `reindex_reduce` and `contiguous` are materialised (a reduce may
  still fuse into its only consumer as an epilogue, or as a row prologue computed once per row of
  it: see `lower.py`, `rows.py`); a contraction is never fused so that it loses its register
  tile: a reduction with one value per element of its reader (a projection read through a
  head-split permute) fuses only when it sums at most rows.PER_ELEMENT_TERMS terms, and an operand
  read with a stride along the output row is packed into a panel (`nest.py`);
- views (`reindex`, `const`, `index`) and element-wise nodes are inlined into their consumers;
- an element-wise node read by more than one consumer is recomputed in each if it is cheap
  (cost <= CHEAP_COST), materialised otherwise, unless every consumer is element-wise and they all
  end in one kernel, which then computes it once per position (`_computed_once`);
- a computed value read through an expanding reindex (a broadcast or a window that reads each
  element several times: a 3x3 conv with K filters reads its input 9K times) is materialised
  unless cost x reads per element <= EXPAND_BUDGET (reads along the row of a cheap per-row value
  count once: its reader computes it once per row, `_along_rows`; where a reshape is read so, the
  value it reshapes is the one materialised, `_reshaped`), or it has fewer than SMALL elements (a kernel
  launch costs more than recomputing a scalar or a small batch's row statistics; a batch counted
  as at least NOMINAL rows where kernels take it at run time);
- a padded view (a reindex that reads outside its source and fills there) read through an
  expanding reindex (one with more elements than its source, even fewer than twice as many: a
  3x3/2 pooling window) is materialised when it has at least SMALL elements (counted so too): a
  convolution then reads a zero-bordered copy, and its vectorised loop has no bounds test per
  element (conv 3x3 on (8,64,56,56): 65-80 GFLOP/s with the test, 121-158 without);
- the integer index tensors (extras) of a reindex or reindex_reduce are materialised, and so is a
  reindex through them where kernels take their batch at run time (a token or position embedding:
  a kernel reading an index tensor stays per batch size, its readers need not);
- a chain of inlined nodes deeper than MAX_DEPTH is cut (bounded compile time and stack), counted
  through the shared values a kernel computes once (which a long relu chain is made of).
Cost: 1 per element-wise op, TRANSCENDENTAL_COST per transcendental, 0 for views and loads (and
casts from float16 and bfloat16, which loads widen, and ops on constants alone, which the C
compiler folds: a mean's 1 / n).
"""
import math
import sys

from metagraph.compiler.generic import NOMINAL
from metagraph.compiler.simplify import value_range
from metagraph.dtypes import LOW_PRECISION
from metagraph.expr import Const, Var, reshape_map, variables
from metagraph.ops.table import ELEMENTWISE, TABLE

CHEAP_COST = 12        # recomputing a sigmoid beats writing it out and reading it back
EXPAND_BUDGET = 16
SMALL = 1024
TRANSCENDENTAL_COST = 4
TRANSCENDENTAL = {"recip", "sqrt", "exp2", "log2", "sin", "cos", "pow"}
ALWAYS_MATERIALISED = {"reduce", "reindex_reduce", "contiguous"}
MAX_DEPTH = 512
# Lowering and rendering walk a kernel's value tree recursively, a few frames per level:
# `allow_depth` lets Python recurse that deep (a 100-step relu chain exceeded the default 1000).
RECURSION_LIMIT = 12 * MAX_DEPTH


def _consumers(graph):
    count = [0] * len(graph.nodes)
    for node in graph.nodes:
        if node.buffer is None:
            for source in node.inputs:
                count[_pos(graph, source)] += 1
    for out in graph.outputs:
        count[out] += 1
    return count


def _pos(graph, node):
    return graph.position[node.id]


def materialised(graph, batched=frozenset()):
    """The positions of nodes that get their own buffer (an output that holds one already needs
    no kernel: one would read its own, uninitialised, output). `batched`: where kernels take their
    first extent at run time, the positions that carry the data's batch (generic.batched), whose
    first extent a size counts as at least NOMINAL (`_elements`)."""
    consumers = _consumers(graph)
    chosen = {k for k in graph.outputs if graph.nodes[k].buffer is None}
    for k, node in enumerate(graph.nodes):
        if node.buffer is None and node.op in ALWAYS_MATERIALISED:
            chosen.add(k)
        if node.buffer is None and node.op in ("reindex", "reindex_reduce"):
            chosen.update(_pos(graph, extra) for extra in node.inputs[1:] if extra.buffer is None)
            if node.op == "reindex" and len(node.inputs) > 1 and batched:
                chosen.add(k)       # a gather: the kernels reading it stay generic (generic.py)
    cost, depth, shared, constant = [0] * len(graph.nodes), [0] * len(graph.nodes), set(), set()
    batch_rows = {graph.nodes[k].shape[0] for k in batched}       # the batch's first extents
    for k, node in enumerate(graph.nodes):
        if node.buffer is not None or k in chosen or node.op in ("const", "index"):
            continue
        depth[k] = 1 + max((depth[_pos(graph, source)] for source in node.inputs), default=0)
        if depth[k] > MAX_DEPTH:
            chosen.add(k)
            depth[k] = 0
            continue
        cost[k] = sum(cost[_pos(graph, source)] for source in node.inputs)
        if TABLE[node.op].kind == ELEMENTWISE:
            if all(source.op == "const" or source.id in constant for source in node.inputs):
                constant.add(node.id)       # (of constants only: the C compiler folds it, cost 0)
            elif not (node.op == "cast" and node.inputs[0].dtype in LOW_PRECISION):
                # (widening a float16 or bfloat16 value is part of its load: compiler/decompose.py)
                cost[k] += TRANSCENDENTAL_COST if node.op in TRANSCENDENTAL else 1
            if consumers[k] > 1 and cost[k] > CHEAP_COST:
                chosen.add(k)
                shared.add(k)       # computed once by its readers' kernel if they are one (below)
                cost[k] = 0         # its readers do not compute it again, but its depth stays
        if node.op == "reindex":
            source = _pos(graph, node.inputs[0])
            widened = node.inputs[0]
            if widened.op == "cast" and widened.inputs[0].dtype in LOW_PRECISION:
                # a float16 or bfloat16 value widened under a view (ops/linalg.py: a contraction's
                # operand, a conv's padded window): its copy, if it needs one, keeps the narrow
                # type, and the view's loads widen it as they read
                source = _pos(graph, widened.inputs[0])
            # a padded copy pays even where a window reads its elements fewer than twice each on
            # average: a 3x3/2 max-pool over a 16x16 plane (1.9 reads) 5.4 -> 0.2 ms + 0.4 to copy
            repeated = _elements(node, True) if _repeats_rows(node, batch_rows) else node.numel
            ratio = repeated / max(node.inputs[0].numel, 1)
            # a cheap value invariant along the row is computed once per row (a reader that runs
            # across rows computes it per element: at most CHEAP_COST, as a cheap fan-out does)
            computed = int(ratio / (_along_rows(node) if cost[source] <= CHEAP_COST else 1))
            expensive = computed > 1 and cost[source] * computed > EXPAND_BUDGET
            elements = _elements(node.inputs[0], _pos(graph, node.inputs[0]) in batched)
            if elements >= SMALL and (expensive or (ratio > 1 and _padded(graph.nodes[source]))):
                while expensive and _reshaped(graph.nodes[source]):     # (the value, not its reshape)
                    source = _pos(graph, graph.nodes[source].inputs[0])
                chosen.add(source)
                cost[k] = 0
    return chosen - _computed_once(graph, chosen, shared)


def _computed_once(graph, chosen, shared):
    """The values of `shared` (element-wise, chosen because several consumers read them) whose
    consumers are all element-wise and all end in one kernel: that kernel reads them at one
    position each time, and the lowering computes a value once per position, so they need no
    buffer (erf, tanh and softplus were two or three kernels each, and GELU did not fuse into the
    linear layer before it). Walked from the last node back, consumers first."""
    readers = [[] for _ in graph.nodes]
    for k, node in enumerate(graph.nodes):
        if node.buffer is None:
            for source in node.inputs:
                readers[_pos(graph, source)].append(k)
    kernel, once = {}, set()      # position -> the one kernel that reads it at its position, or None
    for k in reversed(range(len(graph.nodes))):
        if graph.nodes[k].buffer is not None:
            continue
        if k in chosen and k not in shared:
            kernel[k] = k
            continue
        roots = {kernel.get(c) if TABLE[graph.nodes[c].op].kind == ELEMENTWISE else None for c in readers[k]}
        single = roots.pop() if len(roots) == 1 else None
        if k in shared and single is None:
            kernel[k] = k
            continue
        if k in shared:
            once.add(k)
        kernel[k] = single
    return once


def _elements(node, batch):
    """A node's elements, its first extent counted as at least NOMINAL where it carries the `batch`:
    a kernel that takes its first extent at run time serves batches of every size, and what it
    reads inlined must not change with the batch (a padded 1-channel 28x28 image was copied from 2
    images on, inlined for one; a linear layer's 128 outputs were read inlined below 8 rows)."""
    if batch and node.shape[0] < NOMINAL:
        return node.numel // node.shape[0] * NOMINAL if node.shape[0] else 0
    return node.numel


def _repeats_rows(node, batch_rows):
    """Whether `node` is a view whose rows, as many as the batch's (`batch_rows`: its first
    extents), all read the same element of its input: a per-channel value broadcast over the batch,
    which a kernel taking its first extent at run time repeats for NOMINAL rows or more, at a batch
    of one as at any other (it has one row there: MobileNetV2's last batch norm inlined its scale
    at a batch of one, and batch 2 compiled three kernels again)."""
    return node.ndim > 0 and node.shape[0] in batch_rows and len(node.inputs) == 1 and \
        all(0 not in variables(term) for term in node.attrs["index_map"])


def _along_rows(node):
    """How many times a view repeats each element of its input along its last dimensions, where
    it repeats it only there (a per-row value broadcast along the row: 1 otherwise). Its reader's
    loops along those dimensions are its innermost, so the value, invariant in them, is computed
    once per row (the C compiler hoists it; a row prologue's rsqrt(var + eps) in layer norm was
    copied out for 1,024 rows or more: three kernels, three passes over the input)."""
    index_map, source = node.attrs["index_map"], node.inputs[0]
    if len(node.inputs) > 1 or source.ndim != node.ndim:
        return 1
    kept = 0
    while kept < node.ndim and index_map[kept] == Var(kept):
        kept += 1
    trailing = range(kept, node.ndim)
    if not all(index_map[d] == Const(0) and source.shape[d] == 1 for d in trailing):
        return 1
    return max(1, math.prod(node.shape[d] for d in trailing))


def _reshaped(node):
    """Whether `node` is a reshape that only adds or drops dimensions of one (its map is
    expr.reshape_map's, and plain variables and zeros): it reads its input's elements in their own
    order, at the same offsets. Where a broadcast reads one expensively, its input is copied out,
    not the view: the same values, and a batch of one (whose broadcast is no view at all, so that
    the reshape itself is read expanded) copies out the same value as every other batch. (A reshape
    that splits or merges dimensions is copied out as it is: a contraction reads its operand whole,
    and reading one through // and % is not lowered everywhere.)"""
    if node.op != "reindex" or node.buffer is not None or len(node.inputs) > 1 or node.attrs["checked"] \
            or node.inputs[0].buffer is not None:
        return False
    index_map = tuple(node.attrs["index_map"])
    return all(isinstance(e, (Var, Const)) for e in index_map) and \
        index_map == tuple(reshape_map(node.inputs[0].shape, node.shape))


def _padded(node):
    """Whether `node` is a view that reads outside its source (and gives its fill there), of a
    computed source: a constant's padded view is a test of the indices, cheaper to compute than to
    read (a max pooling's padding mask, read as bytes with a stride, kept its tap search from
    vectorising well: 0.79 -> 0.63 ms)."""
    if node.op != "reindex" or node.buffer is not None or node.attrs["checked"] or len(node.inputs) > 1 \
            or node.inputs[0].op in ("const", "index"):
        return False
    extents = dict(enumerate(node.shape))
    ranges = [value_range(expr, extents) for expr in node.attrs["index_map"]]
    return any(low < 0 or high >= size for (low, high), size in zip(ranges, node.inputs[0].shape))


def allow_depth():
    """Let Python recurse as deep as lowering and rendering a MAX_DEPTH chain takes (raised once for
    the process, never lowered: another thread may be compiling)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
