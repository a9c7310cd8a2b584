"""Runs a schedule: allocates each kernel's output, launches it, reports run-time errors."""
import sys
import time

import numpy as np

from metagraph import flags
from metagraph.errors import MetagraphError, OutOfMemory, at
from metagraph.ops.node import reported_op
from metagraph.runtime import profiler
from metagraph.runtime.pool import Pool

# Every buffer run() allocates has this many zero bytes past its end, which kernels may read (a
# register tile's lanes past its row) and never write: the schedule is told so (lower.schedule).
SLACK_BYTES = 128
POOL = Pool()


def run(graph, steps, functions, sources, oracle=None, seconds=None, explain=None):
    """Launch every step; returns every array computed or read, by graph position (and appends
    each launch's time to `seconds`, a list, when given). When a kernel reports a failed check,
    `explain(graph, step, buffers)` may raise the error with more detail than the kernel gives
    (the offending index)."""
    buffers = {k: node.buffer for k, node in enumerate(graph.nodes) if node.buffer is not None}
    report = profiler.current()
    error = np.zeros(1, np.int64)
    for step, function, source in zip(steps, functions, sources):
        node = graph.nodes[step.positions[0]]
        out = allocate(node.shape, node.dtype.np, node)
        buffers[step.positions[0]] = out
        arrays = [buffers[k] for k in step.positions]
        start = time.perf_counter()
        if out.size:
            function(arrays, error)
        elapsed = time.perf_counter() - start
        if seconds is not None:
            seconds.append(elapsed)
        if report is not None:
            report.allocate(out.nbytes)
            report.kernel(step.name, source, elapsed)
        if flags.DEBUG:
            print(f"metagraph: {step.name} {elapsed * 1e6:.0f} us", file=sys.stderr)
        if error[0]:
            if explain is not None:
                explain(graph, step, buffers)
            _raise(graph, step, int(error[0]))
        if oracle is not None:
            oracle(graph, step, buffers, source)
    if report is not None:
        for k in buffers:
            if graph.nodes[k].buffer is None:
                report.free(buffers[k].nbytes)
    return buffers


def empty_cache():
    """Give the free arrays that the buffer pool keeps for reuse back to malloc (and so, for large
    ones, to the operating system)."""
    POOL.release()


def allocate(shape, dtype, node=None):
    """An uninitialised array of `shape` and `dtype`, followed by SLACK_BYTES zero bytes (every
    itemsize divides SLACK_BYTES); for `node`'s value, which an allocation that fails names."""
    try:
        return POOL.take(shape, dtype, SLACK_BYTES)
    except OutOfMemory as error:
        if node is None:
            raise
        raise OutOfMemory(f"{reported_op(node)}: {error} for a {node.dtype.name} value of shape {node.shape} "
                          f"(node created at {at(node.location)})") from None


def _raise(graph, step, site):
    if site < 0 or site > len(step.sites):
        raise MetagraphError(f"kernel {step.name}: an index expression divided by zero")
    kind, message, position = step.sites[site - 1]
    raise kind(f"{message} (node created at {at(graph.nodes[position].location)}; kernel {step.name})")
