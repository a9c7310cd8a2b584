"""Autotuning remembered on disk: the search. A blocked reduction that takes long enough (its
launches in one run, together) is lowered again in variants: every block of heuristic.BLOCKS that
applies to it, other register budgets, no rounding up to whole vectors, channel tiles and lane
accumulators where the heuristic would not use them or without them where it would, and schedules
near the heuristic's (compiler/search.py: other tile widths and jams). The cost model
(compiler/cost.py) ranks the variants; the heuristic's own kernel, the KEEP - 1 cheapest others
and the KEEP_NEAR cheapest near schedules are compiled and timed on the buffers the kernel has just
run on; the search then climbs through the schedules near the fastest (`fastest`). The winner is
remembered in the kernel cache under the kernel's name and the thread count it was timed on, with
the search's version, so that every later schedule and every later process on as many threads uses
it without timing again (until another search would choose anew).

Tuning happens on a schedule's second run, never its first (a cold start compiles only the
heuristic choices), and a process starts tuning no kernel once it has spent METAGRAPH_TUNE
seconds on it (default 5; 0 turns it off; one kernel's variants take 0.1-0.5 s). Blocks and
register tiles compute each output with the same operations in the same order (they change which
outputs are computed together, not how); lane accumulators sum a reduction in another order,
within the rounding every backend's reductions already allow.
"""
import math
import sys
import time
from dataclasses import replace

import numpy as np

from metagraph import flags
from metagraph.compiler import cost, schedule
from metagraph.compiler.lower import relower
from metagraph.compiler.heuristic import BLOCKS
from metagraph.runtime import executor

MIN_SECONDS = 1e-3      # kernels whose launches in a run take less are not worth compiling variants for
SEARCH = "search-2"      # what chose a remembered target: a choice of another search is made again
KEEP = 5                # variants compiled and timed per kernel: the heuristic's and the cheapest others
# ... and the cheapest of the schedules near the heuristic's, timed whatever the others cost: the
# cost model ranks many of them equal to the heuristic's (a conv's weight gradient jammed 4 or 8
# rows: 231.5M cycles both, 14.8 and 18.0 ms measured on one core)
KEEP_NEAR = 3
CLIMBS = 2              # rounds of schedules near the fastest so far, after the first
CLIMB_GAIN = 0.03       # ... while one of them is this much faster
REPEATS = 3             # timed runs of each variant (the fastest counts)


def _block(text):
    """A remembered block: its name, or None (written "None") for the heuristic's order."""
    return None if text == "None" else text


def _steps(text):
    """A remembered step list (schedule.text), or None (written "None") for the heuristic's."""
    return None if text == "None" else tuple(schedule.parsed(text))


_TUNED = (("registers", int), ("slack", int), ("tile_fill", float), ("lane_gain", float),
          ("block", _block), ("steps", _steps))     # remembered


def _written(target):
    """The remembered fields of a target as the cache's text: one word each, after the search's
    version."""
    return " ".join([SEARCH] + [schedule.text(target.steps) if field == "steps" and target.steps is not None
                                else str(getattr(target, field)) for field, _ in _TUNED])


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
        row short of whole vectors or for none, lane accumulators wherever they save vector
        instructions or nowhere, and each block tried first with each register budget (variants
        that render the same kernel count once)."""
        target = self.pipeline.target
        budgets = (target.registers, target.registers * 3 // 4, target.registers // 2)
        return [target, *(replace(target, registers=registers) for registers in budgets[1:]),
                replace(target, slack=0), replace(target, tile_fill=1.0), replace(target, tile_fill=0.0),
                replace(target, lane_gain=1.0), replace(target, lane_gain=math.inf),
                *(replace(target, block=block, registers=registers)
                  for block in BLOCKS for registers in budgets)]

    def neighbours(self, graph, step):
        """The backend's target with each step list near the heuristic's schedule of `step`
        (compiler/search.py: other jam rows and tile widths, one jam more or less, no rounding up
        or packing) in place of it."""
        target = self.pipeline.target
        near = relower(graph, step, replace(target, search=True)).neighbours
        return [replace(target, steps=steps) for steps in near]

    def get(self, name):
        """The target remembered for the kernel `name` (its register budget, slack, tile fill,
        lane gain, block and step list as text in the cache), or None."""
        text = self.cache.tuned(self.key(name))
        if text is None:
            return None
        parts = text.split()
        if len(parts) != len(_TUNED) + 1 or parts[0] != SEARCH:
            return None          # chosen by another search, or written by another version: tuned again
        parts = parts[1:]
        try:
            chosen = {field: kind(part) for (field, kind), part in zip(_TUNED, parts)}
        except ValueError:
            return None          # not ours, or damaged: tuned again, never trusted
        return replace(self.pipeline.target, **chosen)

    def key(self, name):
        """What a choice for kernel `name` is remembered under: the name and the thread count (the
        variants were timed on that many threads; a schedule tuned on one core need not win on two)."""
        return f"{name} threads {self.pipeline.target.threads}"

    def wanted(self, run):
        """Whether a schedule's `run`-th run (from 1) should be timed for tuning: its second."""
        return flags.TUNE > 0 and run == 2 and self.spent < flags.TUNE

    def tune(self, graph, entry, i, buffers, seconds):
        """Step `i` of a pipeline.realize.Schedule `entry` has just run in `seconds` on `buffers`,
        which still hold its inputs: if it is slow, undecided and the budget lasts, time its
        variants and replace it in place by the winner (for the schedule's later runs)."""
        step = entry.steps[i]
        name = step.tuned_from or step.name
        if self.spent >= flags.TUNE or not tunable(step) or seconds * _launches(entry, name) < MIN_SECONDS \
                or any(k not in buffers for k in step.positions[1:]) or self.get(name) is not None:
            return
        start = time.perf_counter()
        best = self.fastest(graph, step, buffers)
        self.spent += time.perf_counter() - start
        self.cache.remember(self.key(name), _written(best[0]))
        entry.steps[i], entry.functions[i], entry.sources[i] = best[1].compiled(), best[2], best[3]
        if flags.DEBUG:
            words = _written(best[0]).split()[1:]
            choice = ", ".join(f"{field} {word}" for (field, _), word in zip(_TUNED, words))
            print(f"metagraph: tuned {name}: {choice} ({self.spent:.1f} s of {flags.TUNE:g} spent)",
                  file=sys.stderr)

    def fastest(self, graph, step, buffers):
        """(target, step, function, source) of the fastest of `step`'s variants that are timed: the
        heuristic's, the KEEP - 1 other targets the cost model ranks cheapest and the KEEP_NEAR
        cheapest schedules near the heuristic's; then, for at most CLIMBS rounds, the KEEP_NEAR
        cheapest schedules near the fastest so far, timed beside it, while one of them is faster
        by CLIMB_GAIN (a hill climb: schedules two or more choices away from the heuristic's)."""
        seen = set()
        (heuristic, *others) = self._ranked(graph, step, self.candidates(), seen)
        near = self._ranked(graph, step, self.neighbours(graph, step), seen)
        best, best_time = None, math.inf
        contenders = [heuristic] + others[:KEEP - 1] + near[:KEEP_NEAR]
        for _ in range(CLIMBS + 1):
            timed = self._timed(contenders, step, graph, buffers)
            fastest = min(timed, key=lambda found: found[-1])
            if best is not None and fastest[-1] >= best_time * (1 - CLIMB_GAIN):
                break
            best, best_time = fastest[:-1], fastest[-1]
            around = replace(best[0], search=True)
            near = self._ranked(graph, step, [replace(best[0], steps=steps)
                                              for steps in relower(graph, step, around).neighbours], seen)
            if not near:
                break
            contenders = [(best[0], best[1])] + near[:KEEP_NEAR]
        return best

    def _ranked(self, graph, step, choices, seen):
        """(target, step) of each choice whose kernel renders a source not `seen` yet, the first
        choice first and the others by the cost model's estimate."""
        variants = []
        for choice in choices:
            other = relower(graph, step, choice)
            source = self.pipeline.render([other.kernel])
            if source not in seen:
                seen.add(source)
                variants.append((choice, other))
        threads = self.pipeline.target.threads
        return variants[:1] + sorted(variants[1:], key=lambda variant: cost.estimate(
            variant[1].kernel.body, threads).cycles)

    def _timed(self, variants, step, graph, buffers):
        """(target, step, function, source, seconds) of each (target, step) variant, timed together."""
        functions, sources = self.pipeline.load([other.kernel for _, other in variants])
        seconds = self.time(functions, step, graph, buffers)
        return [(*variant, function, source, took)
                for variant, function, source, took in zip(variants, functions, sources, seconds)]

    @staticmethod
    def time(functions, step, graph, buffers):
        """The fastest of REPEATS calls of each function (variants of `step`), after a warm call,
        called in turn so that whatever else the machine does falls on all of them alike; one
        output array serves them all (variants are relowered without run-time extents:
        none takes its extent at run time, compiler/generic.py)."""
        node = graph.nodes[step.positions[0]]
        arrays = [executor.allocate(node.shape, node.dtype.np)] + [buffers[k] for k in step.positions[1:]]
        error = np.zeros(1, dtype=np.int64)
        for function in functions:
            function(arrays, error)
        best = [float("inf")] * len(functions)
        for _ in range(REPEATS):
            for k, function in enumerate(functions):
                start = time.perf_counter()
                function(arrays, error)
                best[k] = min(best[k], time.perf_counter() - start)
        return best


def _launches(entry, name):
    """How many launches of the kernel `name` a run of the schedule `entry` makes."""
    return sum(1 for step in entry.steps if (step.tuned_from or step.name) == name)
