"""Runs a schedule: allocates each kernel's output, launches it, reports run-time errors."""
import sys
import time

import numpy as np

from metagraph import flags
from metagraph.errors import MetagraphError, OutOfMemory, at
from metagraph.ops.node import reported_op
from metagraph.ops.scalars import Realisations
from metagraph.runtime import donation, pool, profiler

# Every buffer run() allocates has this many zero bytes past its end, which kernels may read (a
# register tile's lanes past its row) and never write: the schedule is told so (lower.schedule).
SLACK_BYTES = 128
POOL = pool.HOST


class HostMemory:
    """What run() asks of a memory, for kernels that work in host memory (c, llvm, bang): realised
    values as they are, outputs from the pool, an error word read after each launch. A backend
    with memory of its own gives run() another (runtime/opencl.py's DeviceMemory)."""

    @staticmethod
    def resident(node):
        """The buffer kernels read for a realised node."""
        return node.buffer

    @staticmethod
    def allocate(node):
        """A buffer for node's value."""
        return allocate(node.shape, node.dtype.np, node)

    @staticmethod
    def errors():
        """A run's error words."""
        return HostErrors()

    @staticmethod
    def finish(graph, buffers):
        """The run's buffers as the caller keeps them."""
        return buffers


class HostErrors:
    """The error word of a run in host memory: a kernel that fails a check sets it (to the check's
    number, or -1 for a zero divisor in an index); read after each launch."""
    __slots__ = ("word", "view")

    def __init__(self):
        self.word = np.zeros(1, np.int64)
        self.view = memoryview(self.word)       # reads the word as an int without a numpy scalar

    def at(self, step):
        """What step `step`'s kernel is given."""
        return self.word

    def site(self):
        """The check the last launch failed, or 0."""
        return self.view[0]

    @staticmethod
    def failure():
        """(step, check) of a failure reported only at the end of the run: never here."""
        return None


HOST = HostMemory()


def last_uses(steps):
    """For each position the steps read or compute: the index of the last step that does."""
    last = {}
    for i, step in enumerate(steps):
        last.setdefault(step.positions[0], i)
        for position in step.positions[1:]:
            last[position] = i
    return last


def external_reads(steps, outputs):
    """The positions that the steps read, or that are `outputs`, and none of the steps computes: the
    realised values a run starts from and returns (the graph's other realised nodes need not be
    looked up)."""
    computed = {step.positions[0] for step in steps}
    return tuple(sorted({k for step in steps for k in step.positions[1:]}.union(outputs) - computed))


def dead_after(steps, outputs, last=None):
    """For each step, the positions it is the last to read (or computes and nothing reads) among
    those the steps compute and that are not outputs: their buffers can go back to the pool once
    it has run, so that a training step's peak is its live values, not every value it made.
    (`last`: last_uses(steps), when the caller has it.)"""
    computed = {step.positions[0] for step in steps}
    last = last_uses(steps) if last is None else last
    dead, kept = [[] for _ in steps], set(outputs)
    for position, i in last.items():
        if position in computed and position not in kept:
            dead[i].append(position)
    return dead


def run(graph, steps, functions, sources, oracle=None, tune=None, explain=None, origins=None,
        dead=None, donations=None, memory=HOST, reads=None):
    """Launch every step; returns every array computed or read, by graph position. `tune(k,
    buffers, seconds)`, when given, is called after step k has run (in `seconds`) while its inputs
    are still in `buffers` (tuning times variants of it there). When a kernel reports a failed check,
    `explain(graph, step, buffers)` may raise the error with more detail than the kernel gives
    (the offending index). `origins`: what each step was built from (provenance.Origin), which
    the profile and METAGRAPH_DEBUG name. `dead` (from dead_after): buffers dropped after each
    step, not returned; a node that requires grad keeps its buffer (realize gives it to the node)
    unless `donations` shows nothing outside this graph can reach it (Donations.unshared).
    `donations` (a donation.Plan, for host buffers): inputs whose buffers steps may write their
    outputs over. `memory` (HostMemory's methods) holds the buffers.
    `reads` (external_reads(steps), when the caller keeps it): the realised positions to look up.
    Written for the common case, a run nobody times (a training step launches hundreds of kernels)."""
    Realisations.count += 1         # (a scalar given again after this is an iteration's: ops/scalars.py)
    nodes = graph.nodes
    if reads is None:
        buffers = {k: memory.resident(node) for k, node in enumerate(nodes) if node.buffer is not None}
    elif memory is HOST:
        buffers = {k: nodes[k].buffer for k in reads}
    else:
        buffers = {k: memory.resident(nodes[k]) for k in reads}
    report = profiler.current()
    timed = tune is not None or report is not None or flags.DEBUG
    errors = memory.errors()
    donors = donations is not None and donations.any
    donating = None
    if donors or donations is not None and donations.releases:
        donating = donation.Donations(graph, donations, POOL, SLACK_BYTES)
    allocate, elapsed, finished = memory.allocate, 0.0, 0
    try:
        for k, (step, function, source) in enumerate(zip(steps, functions, sources)):
            positions = step.positions
            given = donating.donor(k, buffers) if donors and donations.donors[k] else None
            fresh = given is None
            # (no name here holds the node: donation counts the references to nodes)
            out = allocate(nodes[positions[0]]) if fresh else buffers[given]
            buffers[positions[0]] = out
            if timed:
                start = time.perf_counter()
            if out.size:
                arguments = [buffers[position] for position in positions]
                if step.outer is not None:
                    arguments.append(outer_argument(step.outer))
                function(arguments, errors.at(k))
            if timed:
                elapsed = time.perf_counter() - start
            if not fresh:
                del buffers[given]
            if report is not None:
                report.allocate(out.nbytes if fresh else 0)
                report.kernel(step.name, source, elapsed, start, origins[k] if origins else None)
            if flags.DEBUG:
                print(f"metagraph: {step.name} {elapsed * 1e6:.0f} us  {origins[k] if origins else ''}",
                      file=sys.stderr)
            site = errors.site()
            if site:
                _fail(graph, step, site, buffers, explain if fresh else None)     # (a donated input is gone)
            if oracle is not None:
                oracle(graph, step, buffers, source)
            if tune is not None and fresh:
                tune(k, buffers, elapsed)
            finished = k + 1
            for position in dead[k] if dead is not None else ():
                if not nodes[position].requires_grad or (donating is not None and
                                                         donating.unshared(position)):
                    dropped = buffers.pop(position)
                    if report is not None:
                        report.free(dropped.nbytes)
        failure = errors.failure()
        if failure is not None:
            _fail(graph, steps[failure[0]], failure[1], buffers, explain)
    except BaseException:
        if donating is not None and donating.given:     # what it computed must not need a donor
            donation.keep_computed(graph, buffers, [step.positions[0] for step in steps[:finished]])
        raise
    if report is not None:
        for k in buffers:
            if graph.nodes[k].buffer is None:
                report.free(buffers[k].nbytes)
    return memory.finish(graph, buffers)


_OUTER = {}          # extent -> its launch argument (outer_argument)


def outer_argument(extent):
    """The argument after a kernel's parameters that gives a kernel with a run-time outer extent
    (compiler/generic.py) its extent: a one-element int64 array, made once per extent."""
    argument = _OUTER.get(extent)
    if argument is None:
        if len(_OUTER) >= 4096:
            _OUTER.clear()
        argument = _OUTER[extent] = np.array([extent], np.int64)
    return argument


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
        raise for_node(error, node) from None


def for_node(error, node):
    """An allocation's OutOfMemory `error` as the error of `node`'s value: its op, shape and line."""
    return OutOfMemory(f"{reported_op(node)}: {error} for a {node.dtype.name} value of shape {node.shape} "
                       f"(node created at {at(node.location)})")


def _fail(graph, step, site, buffers, explain):
    """Raise the error of `step`'s failed check `site`, with `explain`'s detail when it can give it."""
    if explain is not None:
        explain(graph, step, buffers)
    _raise(graph, step, site)


def _raise(graph, step, site):
    if site < 0 or site > len(step.sites):
        raise MetagraphError(f"kernel {step.name}: an index expression divided by zero")
    kind, message, position = step.sites[site - 1]
    raise kind(f"{message} (node created at {at(graph.nodes[position].location)}; kernel {step.name})")
