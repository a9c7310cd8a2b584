"""What every code generator shares: the schedule cache, batch compilation and launching.

A code generator subclasses CompiledBackend and provides `load(kernels)`: the callables (and
their sources) for a list of kernels, compiling the ones it has not seen in one batch.
"""
import sys

import numpy as np

from metagraph import flags
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.errors import MetagraphError, at
from metagraph.runtime import executor

SCHEDULE_CACHE_SIZE = 4096


class CompiledBackend:
    name = None

    def __init__(self):
        self.schedules = {}

    def load(self, kernels):
        """(callables, sources) for the kernels; each callable takes (arrays, error array)."""
        raise NotImplementedError

    def realize(self, outputs):
        graph = pending_graph(outputs)
        entry = self.schedules.get(graph.key)
        if entry is None:
            steps = schedule(graph)
            if flags.DEBUG >= 3:
                print("metagraph: new schedule\n" + "\n".join(
                    f"  {k}: {n.op} {n.shape} {n.dtype.name} <- "
                    f"{[graph.position[i.id] for i in n.inputs]}" for k, n in enumerate(graph.nodes)),
                    file=sys.stderr)
            try:
                functions, sources = self.load([step.kernel for step in steps])
            except MetagraphError as error:
                lines = sorted({at(graph.nodes[step.positions[0]].location) for step in steps})
                raise type(error)(f"{error}\n(compiling the kernels for values created at "
                                  f"{', '.join(lines)})") from None
            entry = (steps, functions, sources)
            if len(self.schedules) >= SCHEDULE_CACHE_SIZE:
                self.schedules.pop(next(iter(self.schedules)))
            self.schedules[graph.key] = entry
        buffers = executor.run(graph, *entry, oracle=check_against_oracle if flags.CHECK else None)
        # Values that autograd keeps anyway keep their buffers too, so that reading the loss after
        # optimizer.step() (or a gradient after the loss) does not compute the forward pass again.
        for step in entry[0]:
            node = graph.nodes[step.positions[0]]
            if node.requires_grad and node.buffer is None:
                node.set_buffer(buffers[step.positions[0]])
        return [buffers[k] for k in graph.outputs]


def check_against_oracle(graph, step, buffers, source):
    """METAGRAPH_CHECK=1: recompute the kernel's output with the numpy backend and compare."""
    position = step.positions[0]
    root = graph.nodes[position]
    known = {graph.nodes[k].id: buffers[k] for k in step.positions[1:]}
    known.update({node.id: node.buffer for node in graph.nodes if node.buffer is not None})
    want = NumpyBackend().realize([root], known)[0]
    got = buffers[position]
    if root.dtype.is_float:
        scale = np.nanmax(np.abs(want[np.isfinite(want)]), initial=1.0)
        same = np.isclose(got, want, rtol=1e-3, atol=1e-5 * scale, equal_nan=True)
    else:
        same = got == want
    if not np.all(same):
        worst = np.argwhere(~same)[0]
        raise MetagraphError(f"METAGRAPH_CHECK: kernel {step.kernel.name} gives {got[tuple(worst)]} at "
                             f"{tuple(worst)}, the numpy oracle {want[tuple(worst)]}; source:\n{source}")
