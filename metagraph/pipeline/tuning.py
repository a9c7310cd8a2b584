"""Autotuning remembered on disk: a register-tiled kernel that takes long enough is timed once in
a few variants (other register budgets, no rounding up to whole vectors, channel tiles and lane
accumulators where the heuristic would not use them or without them where it would) on the
buffers it has just run on, and the fastest is remembered in the kernel cache, so that every
later schedule and every later process uses it without timing again.

Tuning happens on a schedule's second run, never its first (a cold start compiles only the
heuristic choices), and a process starts tuning no kernel once it has spent METAGRAPH_TUNE
seconds on it (default 5; 0 turns it off; one kernel's variants take 0.1-0.5 s). Register tiles and
channel tiles compute each output with the same operations in the same order (they change which
outputs are computed together, not how); lane accumulators sum a reduction in another order,
within the rounding every backend's reductions already allow.
"""
import math
import sys
import time
from dataclasses import replace

import numpy as np

from metagraph import flags
from metagraph.compiler.lower import relower
from metagraph.runtime import executor

MIN_SECONDS = 1e-3      # kernels faster than this are not worth compiling variants for
_TUNED = (("registers", int), ("slack", int), ("tile_fill", float), ("lane_gain", float))   # remembered
REPEATS = 3             # timed runs of each variant (the fastest counts)


def tunable(step):
    """Whether a step is a generated reduction whose register tile has parameters to choose."""
    return step.blocked and step.lowering is not None


class Tuner:
    """A pipeline's tuning: its remembered choices (in the kernel cache) and this process's time."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.cache = pipeline.cache
        self.spent = 0.0

    def candidates(self):
        """The backend's target and its variants: half and three quarters of its register budget,
        no reading past buffer ends (so no rounding up to whole vectors), channel tiles for every
        row short of whole vectors or for none, and lane accumulators wherever they save vector
        instructions or nowhere (variants that render the same kernel are timed once)."""
        target = self.pipeline.target
        return [target, replace(target, registers=target.registers // 2),
                replace(target, registers=target.registers * 3 // 4), replace(target, slack=0),
                replace(target, tile_fill=1.0), replace(target, tile_fill=0.0),
                replace(target, lane_gain=1.0), replace(target, lane_gain=math.inf)]

    def get(self, name):
        """The target remembered for the kernel `name` (its register budget, slack, tile fill and
        lane gain as text in the cache), or None."""
        text = self.cache.tuned(name)
        if text is None:
            return None
        parts = text.split()
        if len(parts) != len(_TUNED):
            return None          # written by another version: tuned again
        chosen = {field: kind(part) for (field, kind), part in zip(_TUNED, parts)}
        return replace(self.pipeline.target, **chosen)

    def wanted(self, run):
        """Whether a schedule's `run`-th run (from 1) should be timed for tuning: its second."""
        return flags.TUNE > 0 and run == 2 and self.spent < flags.TUNE

    def tune(self, graph, entry, i, buffers, seconds):
        """Step `i` of a pipeline.realize.Schedule `entry` has just run in `seconds` on `buffers`,
        which still hold its inputs: if it is slow, undecided and the budget lasts, time its
        variants and replace it in place by the winner (for the schedule's later runs)."""
        step = entry.steps[i]
        name = step.tuned_from or step.name
        if (self.spent >= flags.TUNE or seconds < MIN_SECONDS or not tunable(step) or
                any(k not in buffers for k in step.positions[1:]) or self.get(name) is not None):
            return
        start = time.perf_counter()
        best = self.fastest(graph, step, buffers)
        self.spent += time.perf_counter() - start
        self.cache.remember(name, " ".join(str(getattr(best[0], field)) for field, _ in _TUNED))
        entry.steps[i], entry.functions[i], entry.sources[i] = best[1].compiled(), best[2], best[3]
        if flags.DEBUG:
            choice = ", ".join(f"{field} {getattr(best[0], field)}" for field, _ in _TUNED)
            print(f"metagraph: tuned {name}: {choice} ({self.spent:.1f} s of {flags.TUNE:g} spent)",
                  file=sys.stderr)

    def fastest(self, graph, step, buffers):
        """(target, step, function, source) of the fastest variant of `step`."""
        variants, seen = [], set()
        for choice in self.candidates():
            other = relower(graph, step, choice)
            source = self.pipeline.render([other.kernel])
            if source not in seen:
                seen.add(source)
                variants.append((choice, other))
        functions, sources = self.pipeline.load([other.kernel for _, other in variants])
        timed = []
        for (choice, other), function, source in zip(variants, functions, sources):
            timed.append((self.time(function, other, graph, buffers), choice, other, function, source))
        _, choice, other, function, source = min(timed, key=lambda t: t[0])
        return choice, other, function, source

    @staticmethod
    def time(function, step, graph, buffers):
        node = graph.nodes[step.positions[0]]
        arrays = [executor.allocate(node.shape, node.dtype.np)] + [buffers[k] for k in step.positions[1:]]
        error = np.zeros(1, dtype=np.int64)
        function(arrays, error)        # warm
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            function(arrays, error)
            best = min(best, time.perf_counter() - start)
        return best
