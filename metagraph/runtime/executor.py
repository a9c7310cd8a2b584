"""Runs a schedule: allocates each kernel's output, launches it, reports run-time errors."""
import sys
import time

import numpy as np

from metagraph import flags
from metagraph.errors import MetagraphError, at
from metagraph.runtime import profiler
from metagraph.runtime.pool import Pool

# Every buffer run() allocates has this many zero bytes past its end, which kernels may read (a
# register tile's lanes past its row) and never write: the schedule is told so (lower.schedule).
SLACK_BYTES = 128
POOL = Pool()


def run(graph, steps, functions, sources, oracle=None, seconds=None):
    """Launch every step; returns every array computed or read, by graph position (and appends
    each launch's time to `seconds`, a list, when given)."""
    buffers = {k: node.buffer for k, node in enumerate(graph.nodes) if node.buffer is not None}
    report = profiler.current()
    error = np.zeros(1, dtype=np.int64)
    for step, function, source in zip(steps, functions, sources):
        node = graph.nodes[step.positions[0]]
        out = allocate(node.shape, node.dtype.np)
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


def allocate(shape, dtype):
    """An uninitialised array of `shape` and `dtype`, followed by SLACK_BYTES zero bytes (every
    itemsize divides SLACK_BYTES)."""
    return POOL.take(shape, dtype, SLACK_BYTES)


def _raise(graph, step, site):
    if site < 0 or site > len(step.sites):
        raise MetagraphError(f"kernel {step.name}: an index expression divided by zero")
    kind, message, position = step.sites[site - 1]
    where = at(graph.nodes[position].location)
    raise kind(f"{message} (node created at {where}; kernel {step.name})")
