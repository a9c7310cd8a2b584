"""The pipeline that realises a pending graph on a code generator, stage by stage:

    pending graph -> schedule (compiler/lower.py; cached in memory and on disk: stored.py here)
    -> render -> compile (new kernels only, in batches, one per core at once; the kernel cache)
    -> launch (runtime/executor.py) -> tune (its second run, tuning.py)

A code generator (codegen/compiled.py's CompiledBackend) provides only render, compile and open
(its launch) and what its target offers lowering; it knows nothing of schedules, autograd or
the caches. The pipeline keeps, per generator, the schedules it made and the kernels it loaded.
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from operator import attrgetter

import numpy as np

from metagraph import flags
from metagraph.codegen import library
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.compiler import provenance
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.errors import CompileError, MetagraphError, at
from metagraph.ops.node import user_site
from metagraph.ops.stale import Sweep
from metagraph.pipeline.stored import ScheduleStore
from metagraph.pipeline.tuning import Tuner
from metagraph.runtime import donation, executor, profiler, replay

# A pipeline's schedules are swept like the other per-shape memos (ops/stale.py): a dropped one is
# loaded from disk (stored.py) or lowered again when its graph comes back; a CNN over batch sizes
# 1..200 had kept all 200. SCHEDULE_CACHE_SIZE bounds them whatever the sweeps keep.
SCHEDULE_CACHE_SIZE = 4096
REPLAY_FROM = 3         # the run from which a schedule is replayed (its second is tuning's)


@dataclass
class Schedule:
    """A graph structure's kernel launches: steps with their callables and sources (tuning may
    replace a step in place) and how many times it has run."""
    steps: list
    functions: list
    sources: list
    runs: int = 0
    used: int = 0            # the sweep generation it last ran in (Pipeline.sweep)
    members: list = None     # per step, the graph positions its kernel computes (provenance.py)
    dead: list = None        # per step, the buffers no later step reads (executor.dead_after)
    donations: object = None     # runtime.donation.Plan
    reads: tuple = None      # the realised positions the steps read (executor.external_reads)
    replay_plan: object = None   # runtime.replay.Replay once made; False when it cannot replay

    def origins(self, graph):
        """What each step computes for `graph` (a provenance.Origin per step): its ops and lines."""
        if self.members is None:
            self.members = [provenance.members(graph, step) for step in self.steps]
        return [provenance.origin(graph, positions) for positions in self.members]

    def prepare(self, graph):
        """What every run of the schedule needs and no run changes: the buffers each step leaves
        dead, the donation plan, the realised positions it reads."""
        last = executor.last_uses(self.steps)
        self.dead = executor.dead_after(self.steps, graph.outputs, last)
        self.donations = donation.Plan(graph, self.steps, last, self.dead)
        self.reads = executor.external_reads(self.steps, graph.outputs)

    def replayer(self, graph):
        """The schedule's runtime.replay.Replay (made on first use), or None if it cannot have one."""
        if self.replay_plan is None:
            usable = replay.usable(self.functions)
            self.replay_plan = usable and replay.Replay(graph, self.steps, self.functions, self.donations,
                                                        self.dead, self.reads)
        return self.replay_plan or None


class Pipeline:
    """Realises graphs on one code generator (`generator`, a codegen.compiled.CompiledBackend)."""

    def __init__(self, generator):
        self.generator = generator
        self.name = generator.name
        self.cache = generator.cache      # runtime.cache.KernelCache
        self.schedules = {}               # (graph key, library flag) -> Schedule
        self.functions = {}               # kernel key -> callable
        self.texts = {}                   # kernel key -> its source, one string however many schedules
                                          # hold it (a CNN over batch sizes 1..200 held 200 copies)
        self.sweep = Sweep(8)             # of the schedules not run since the last sweep
        self.tuner = Tuner(self)
        self.stored = ScheduleStore(self)

    @property
    def target(self):
        """What the generator offers lowering (compiler/lower.py's Target)."""
        return self.generator.target

    def render(self, kernels):
        """The generator's source text of a batch of kernels."""
        return self.generator.render(kernels)

    # ---- realise -------------------------------------------------------------------------
    def realize(self, outputs):
        """Compute the nodes `outputs`; returns their buffers."""
        made = outputs[0].replayed_from if len(outputs) == 1 else None
        if made is not None:
            value = self._replayed(outputs[0], *made)
            if value is not None:
                return [value]
        began = time.perf_counter()
        graph = pending_graph(outputs)
        key = (graph.key, flags.LIBRARY)
        entry = self.schedules.get(key)         # (one lookup: a large graph's key takes long to hash)
        if entry is None:
            entry = self._stored_schedule(graph) or self._scheduled(graph, began)
            if len(self.schedules) >= SCHEDULE_CACHE_SIZE:
                self.schedules.pop(next(iter(self.schedules)), None)
            self.schedules[key] = entry
            entry.used = self.sweep.generation      # (kept by a sweep now: it holds kernels just loaded)
            if self.sweep.due():
                self._sweep()
        entry.used = self.sweep.generation
        entry.runs += 1
        if entry.dead is None:
            entry.prepare(graph)
        buffers = self._run(graph, entry, outputs)
        if made is not None and made[0].walk is not None and made[0].walk.key is graph.key:
            self._remember_replayed(made[0], graph, entry)
        executor.POOL.age()
        # Values that autograd keeps anyway keep their buffers too, so that reading the loss after
        # optimizer.step() (or a gradient after the loss) does not compute the forward pass again;
        # the run dropped those nothing outside the graph can read again (executor.run).
        nodes = graph.nodes
        for position, array in buffers.items():      # (a realised input's node holds its buffer)
            node = nodes[position]
            if node.requires_grad and node.buffer is None:
                node.set_buffer(array)
        report = profiler.current()
        if report is not None:
            path, line = provenance.line_of(user_site(sys._getframe(1)))
            report.record("realise", "realise", began, time.perf_counter() - began, at=f"{path}:{line}",
                          values=len(graph.outputs), kernels=len(entry.steps))
        return [buffers[k] for k in graph.outputs]

    def _replayed(self, node, template, slots):
        """`node`'s value when it is the result of a recorded call's replay whose graph this pipeline
        can run without it (replay.Replay.plain): its schedule and layout are kept on the
        template's walk, and a run needs no graph walked or key hashed, only the replay's arguments
        (a realised 64^3 `(a @ b).numpy()`, its graph walked: 9.5 us; from the walk: 8.1; with the
        extension's launch and the output taken again: 6.2). The schedule computes the template's
        function of its arguments, so the values of the nodes between (their graph: `intact`) do
        not matter; an argument without a value sends the run through the graph. None when
        anything a run through `realize` would look at is otherwise: flags, a profile, the memory,
        tuning's steps."""
        walk = template.walk
        found = None if walk is None else walk.runs.get((self, flags.LIBRARY))
        if found is None:
            return None
        entry, replaying, layout, reads = found
        if (layout is None or entry.replay_plan is not replaying
                or not self._replayable(self.generator.memory_for((node,)))):
            return None
        value = replaying.run_plain(layout, slots, reads)
        if value is not None:
            entry.used = self.sweep.generation
            entry.runs += 1
            executor.POOL.age()
        return value

    def _remember_replayed(self, template, graph, entry):
        """Keep on the walk of a replayed result's graph what `_replayed` needs to run it again, when
        its schedule runs plainly and reads only the replay's arguments; (entry, its replay, None,
        None) when it does not, so that each replay plan is looked at once."""
        replaying, runs, key = entry.replay_plan, template.walk.runs, (self, flags.LIBRARY)
        known = runs.get(key)
        if not replaying or (known is not None and known[1] is replaying):
            return
        layout = replaying.plain(graph)
        order = template.walk.order        # (the root, the last position, is never read)
        reads = None if layout is None else tuple(order[k] for _, k in layout.read_slots)
        if reads is None or any(k >= template.arguments for k in reads):
            layout = reads = None
        runs[key] = (entry, replaying, layout, reads)

    def _sweep(self):
        """Drop the schedules not run again since the last sweep, and the kernels and sources only
        they held (their binaries stay mapped: SharedObjects). In place: other threads may be
        reading the tables (a kernel another thread is loading is looked up in `load`'s own dict)."""
        self.sweep.prune(self.schedules, attrgetter("used"))
        kept = list(self.schedules.values())
        functions = {id(function) for entry in kept for function in entry.functions}
        sources = {id(source) for entry in kept for source in entry.sources}
        for key in [key for key, function in list(self.functions.items()) if id(function) not in functions]:
            self.functions.pop(key, None)
        for key in [key for key, text in list(self.texts.items()) if id(text) not in sources]:
            self.texts.pop(key, None)

    @staticmethod
    def _replayable(memory):
        """Whether a run whose values live in `memory` may be replayed (runtime/replay.py) rather
        than launched kernel by kernel: host memory, and nothing that wants each kernel seen from
        Python (a profile times each one; METAGRAPH_CHECK and METAGRAPH_DEBUG look at each)."""
        return (memory is executor.HOST and not flags.CHECK and not flags.DEBUG and replay.ENABLED
                and profiler.current() is None)

    def _run(self, graph, entry, outputs):
        """Launch the schedule's kernels; on the run tuning wants, each slow kernel's variants are
        timed just after it ran, while its inputs are live (so the run holds nothing longer). From
        its REPLAY_FROM-th run (tuning's is the second) a schedule is replayed when nothing wants
        each kernel seen from Python (a profile times each one) and its values live in host memory
        (a device's buffers are not C pointers)."""
        memory = self.generator.memory_for(outputs)
        if entry.runs >= REPLAY_FROM and self._replayable(memory):
            replaying = entry.replay_plan
            if replaying is None:
                replaying = entry.replayer(graph)
            if replaying:
                return replaying.run(graph, explain_failure)
        tuning = self.generator.tunable and self.tuner.wanted(entry.runs)
        names = [step.name for step in entry.steps] if tuning else None
        checked = bool(flags.CHECK)      # checking reads every step's inputs: nothing is dropped
        donations = None if checked or memory is not executor.HOST else entry.donations   # host buffers
        report = profiler.current()
        buffers = executor.run(graph, entry.steps, entry.functions, entry.sources,
                               oracle=check_against_oracle if checked else None,
                               tune=partial(self.tuner.tune, graph, entry) if tuning else None,
                               explain=explain_failure, dead=None if checked else entry.dead,
                               donations=donations, memory=memory, reads=entry.reads,
                               origins=entry.origins(graph) if report is not None or flags.DEBUG else None)
        if tuning and names != [step.name for step in entry.steps]:
            self.stored.save(graph, entry.steps, entry.sources)
            entry.replay_plan = None          # made again from the tuned steps
        return buffers

    def lowered(self, graph):
        """The steps lowering gives `graph` for this pipeline (nothing compiled or stored)."""
        return schedule(graph, self.target, bool(flags.LIBRARY), tuned=self.tuner.get if flags.TUNE else None,
                        runtime_extents=self.generator.runtime_extents)

    def _scheduled(self, graph, began):
        """A new Schedule for `graph`: lowered, its kernels loaded (compiled where new), stored."""
        steps = self.lowered(graph)
        report = profiler.current()
        if report is not None:
            report.record("schedule", "schedule", began, time.perf_counter() - began,
                          nodes=len(graph.nodes), kernels=len(steps))
        members = [provenance.members(graph, step) for step in steps]
        origins = [provenance.origin(graph, positions) for positions in members]
        if flags.DEBUG >= 3:
            print("metagraph: new schedule\n" + "\n".join(
                f"  {k}: {n.op} {n.shape} {n.dtype.name} <- "
                f"{[graph.position[i.id] for i in n.inputs]}" for k, n in enumerate(graph.nodes)),
                file=sys.stderr)
        generated = [step for step in steps if step.library is None]
        try:
            compiled = zip(*self.load([step.kernel for step in generated],
                                      [o for step, o in zip(steps, origins) if step.library is None]))
            functions, sources = [], []
            for step in steps:
                function, source = library.launcher(step.library) if step.library else next(compiled)
                functions.append(function)
                sources.append(source)
        except MetagraphError as error:
            lines = sorted({at(graph.nodes[step.positions[0]].location) for step in steps})
            raise type(error)(f"{error}\n(compiling the kernels for values created at "
                              f"{', '.join(lines)})") from None
        entry = Schedule([step.compiled() for step in steps], functions, sources, members=members)
        self.stored.save(graph, entry.steps, entry.sources)
        return entry

    def _stored_schedule(self, graph):
        """The Schedule remembered on disk for graphs like `graph` (stored.py), or None."""
        start = time.perf_counter()
        found = self.stored.load(graph)
        if found is None:
            return None
        report = profiler.current()
        if report is not None:
            report.cache_hits += sum(step.library is None for step in found[0])
            report.record("load", "schedule from disk", start, time.perf_counter() - start,
                          kernels=len(found[0]))
        return Schedule(*found)

    # ---- compile and load ----------------------------------------------------------------
    def load(self, kernels, origins=()):
        """(callables, sources) for the kernels, compiling the ones no cache holds (`origins`, a
        provenance.Origin per kernel, head a compiled file as a comment). An entry whose binary
        lacks its kernel (stale or foreign: its hash cannot tell) is rebuilt and counted as a
        compile, as a corrupt one is."""
        report = profiler.current()
        sources = [self.render([kernel]) for kernel in kernels]
        keys = [self.cache.key(source) for source in sources]
        sources = [self.texts.setdefault(key, source) for key, source in zip(keys, sources)]
        # the kernels as this call finds or opens them (not read back from self.functions, which
        # another thread's sweep may prune meanwhile)
        loaded = {key: self.functions.get(key) for key in keys}
        wanted = list({key: i for i, key in enumerate(keys) if loaded[key] is None}.values())
        missing = [i for i in wanted if self.cache.find(keys[i]) is None]
        described = {kernel.name: found for kernel, found in zip(kernels, origins)}
        self._compile([kernels[i] for i in missing], [keys[i] for i in missing], described)
        compiled = set(missing)
        for i in wanted:
            loaded[keys[i]] = self._open(kernels[i], keys[i], None if i in compiled else report)
        stale = [i for i in wanted if loaded[keys[i]] is None]
        self._compile([kernels[i] for i in stale], [keys[i] for i in stale], described)
        for i in stale:
            loaded[keys[i]] = self._open(kernels[i], keys[i])
            if loaded[keys[i]] is None:
                raise CompileError(f"kernel {kernels[i].name} is missing from the binary just built "
                                   f"for it in {self.cache.directory}")
        if report is not None:
            report.compiles += len(missing) + len(stale)
            report.cache_hits += len(kernels) - len(missing) - len(stale)
        return [loaded[key] for key in keys], sources

    def stored_function(self, key, name):
        """The callable of the cached kernel with `key` and `name`, or None if the cache lacks it."""
        function = self.functions.get(key)
        if function is None:
            path = self.cache.find(key)
            function = None if path is None else self._opened(key, path, name)
        return function

    def _opened(self, key, path, name):
        """Kernel `name` of the binary at `path`, also kept in self.functions under `key`; None when
        the binary lacks it (a stale or foreign binary: its hash cannot tell)."""
        try:
            function = self.functions[key] = self.generator.open(path, name)
        except AttributeError:
            return None
        return function

    def _open(self, kernel, key, report=None):
        """A cached kernel, loaded (_opened); None when its binary lacks the kernel. The load is an
        event of `report` (a profile) when given."""
        start = time.perf_counter()
        path = self.cache.find(key)
        if path is None:
            raise CompileError(f"kernel {kernel.name} vanished from the cache directory "
                               f"{self.cache.directory}")
        function = self._opened(key, path, kernel.name)
        if function is not None and report is not None:
            report.record("load", kernel.name, start, time.perf_counter() - start, path=path)
        return function

    def _compile(self, kernels, keys, described):
        """Compile new kernels: one batch per job, the jobs running at once. A batch's source
        file begins with what `described` (kernel name -> provenance.Origin) says of its kernels,
        outside the text their keys hash."""
        if not kernels:
            return
        generator = self.generator
        groups = max(1, min(generator.compile_jobs, len(kernels)))
        batches = [(kernels[g::groups], keys[g::groups]) for g in range(groups)]
        report = profiler.current()

        def build(batch):
            start = time.perf_counter()
            source = generator.render(batch[0])
            named = [(kernel.name, described[kernel.name]) for kernel in batch[0] if kernel.name in described]
            if named:
                source = provenance.header(named, generator.comment) + source
            path, _ = self.cache.build(source, batch[1], generator.compile)
            if report is not None:
                report.record("compile", f"compile {len(batch[0])} kernel(s)", start,
                              time.perf_counter() - start, path=path,
                              kernels=[f"{k.name}: {described.get(k.name, '')}" for k in batch[0]])
            if flags.DEBUG:
                print(f"metagraph: compiled {len(batch[0])} kernel(s) into {path}", file=sys.stderr)
            if flags.DEBUG >= 2:
                print(source, file=sys.stderr)
        if groups == 1:
            build(batches[0])
            return
        with ThreadPoolExecutor(groups) as pool:      # threads wait on the toolchain
            list(pool.map(build, batches))


def _oracle(graph, step, buffers):
    """The kernel's output recomputed by the numpy backend from the kernel's inputs."""
    known = {graph.nodes[k].id: np.asarray(buffers[k]) for k in step.positions[1:] if k in buffers}
    known.update({node.id: np.asarray(node.buffer) for node in graph.nodes if node.buffer is not None})
    return NumpyBackend().realize([graph.nodes[step.positions[0]]], known)[0]


def explain_failure(graph, step, buffers):
    """A kernel reported a failed check (an index out of bounds, a division by zero), which it
    knows only by number: the numpy backend, computing the same node from the same inputs, raises
    the same error naming the offending index. Only on that path, so it costs nothing otherwise."""
    _oracle(graph, step, buffers)


def check_against_oracle(graph, step, buffers, source):
    """METAGRAPH_CHECK=1: recompute the kernel's output with the numpy backend and compare."""
    position = step.positions[0]
    root = graph.nodes[position]
    want = _oracle(graph, step, buffers)
    got = np.asarray(buffers[position])
    if root.dtype.is_float:
        scale = np.nanmax(np.abs(want[np.isfinite(want)]), initial=1.0)
        same = np.isclose(got, want, rtol=1e-3, atol=1e-5 * scale, equal_nan=True)
    else:
        same = got == want
    if not np.all(same):
        worst = np.argwhere(~same)[0]
        raise MetagraphError(f"METAGRAPH_CHECK: kernel {step.name} gives {got[tuple(worst)]} at "
                             f"{tuple(worst)}, the numpy oracle {want[tuple(worst)]}; source:\n{source}")
