"""What every code generator shares: the schedule cache, the disk cache of compiled batches,
launching, and when an outer loop is worth threads.

A code generator subclasses CompiledBackend and provides `render(kernels)` (one source text for a
batch), `compile(source_path, binary_path)` and `open(binary_path, kernel_name)`; the base class
keys each kernel by its own rendered source, compiles the missing ones (one batch per core, at
once) and loads them.
"""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jinja2
import numpy as np

from metagraph import flags
from metagraph.codegen import bf16_gemm, library
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.codegen.stored import ScheduleStore
from metagraph.codegen.tuning import Tuner
from metagraph.compiler import ir, provenance
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.compiler.nest import ACC_REGISTERS
from metagraph.errors import CompileError, MetagraphError, at  # noqa: F401  (the backends import it here)
from metagraph.ops.node import user_site
from metagraph.runtime import donation, executor, profiler

SCHEDULE_CACHE_SIZE = 4096
PARALLEL_WORK = 1 << 15     # loop nests with less work than this run on one thread


_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def template(name):
    """A code generator's Jinja template from codegen/templates."""
    return _TEMPLATES.get_template(name)


def launcher(ffi, native):
    """The callable fn(arrays, error array) for a native `void kernel(char **args, int64_t *err)`.
    The cffi types are looked up once per kernel, not per call (1 us of a launch's 1.9)."""
    args_type, error_type = ffi.typeof("char *[]"), ffi.typeof("int64_t[]")
    new, from_buffer = ffi.new, ffi.from_buffer

    def launch(arrays, error):
        native(new(args_type, [from_buffer(a) for a in arrays]), from_buffer(error_type, error))
    return launch


def worth_threads(loop):
    """Whether an outer loop is spread over threads (or tasks): parallel, and enough work."""
    return loop.kind == ir.PARALLEL and loop.extent >= 2 and _work(loop) >= PARALLEL_WORK


def thread_groups(body, threaded=None):
    """A kernel's top-level statements as (loop, None) for each outer loop worth threads or tasks
    (`threaded(loop)`; default worth_threads), and (None, statements) for each run of the others,
    in order."""
    threaded = threaded or worth_threads
    groups, serial = [], []
    for s in body:
        if isinstance(s, ir.Loop) and threaded(s):
            if serial:
                groups.append((None, serial))
                serial = []
            groups.append((s, None))
        else:
            serial.append(s)
    if serial:
        groups.append((None, serial))
    return groups


def fused_product(statement, acc_dtype):
    """(a, b, condition) when an array accumulation adds a product a * b of the accumulator's
    float type, where `condition` (an index expression) holds if the product sits in a guard with
    fill 0 (a gathered input gradient's), else None. Code generators render it as one fused
    multiply-add, made only where the condition holds (a masked one, not a multiply by 0 that an
    inf would turn into nan): each reduction is computed in exactly one kernel, so this stays
    deterministic (contracting recomputed values did not)."""
    value, condition = statement.value, None
    if isinstance(value, ir.Guard) and value.valid is None and value.check is None and value.fill == 0:
        value, condition = value.value, value.cond
    if statement.index is None or statement.op != "add" or not isinstance(value, ir.Apply) or \
            value.op != "mul" or value.dtype != acc_dtype or not acc_dtype.is_float or \
            acc_dtype.itemsize < 4:
        return None
    return value.args + (condition,)


def _work(loop):
    inner = [s for s in loop.body if isinstance(s, ir.Loop)]
    return loop.extent * max([_work(s) for s in inner] or [1])


@dataclass
class Schedule:
    """A graph structure's kernel launches: steps with their callables and sources (tuning may
    replace a step in place) and how many times it has run."""
    steps: list
    functions: list
    sources: list
    runs: int = 0
    members: list = None     # per step, the graph positions its kernel computes (provenance.py)
    dead: list = None        # per step, the buffers no later step reads (executor.dead_after)
    donations: object = None     # runtime.donation.Plan
    reads: tuple = None      # the realised positions the steps read (executor.external_reads)

    def origins(self, graph):
        """What each step computes for `graph` (a provenance.Origin per step): its ops and lines."""
        if self.members is None:
            self.members = [provenance.members(graph, step) for step in self.steps]
        return [provenance.origin(graph, positions) for positions in self.members]


class CompiledBackend:
    name = None
    compile_jobs = flags.NUM_THREADS     # toolchain calls that may run at once
    renders = None      # the table ops this backend renders (None: every row); lowering decomposes
                        # the others (compiler/decompose.py)
    accumulator_registers = ACC_REGISTERS   # vector registers a register tile may fill
    read_slack = executor.SLACK_BYTES       # bytes past a buffer's end that kernels may read
    host_memory = False     # buffers are host arrays: bfloat16 matmuls may run on the host's kernel
    comment = "//"          # how a line comment begins in the generated source
    memory = executor.HOST  # where kernels find their buffers (runtime/opencl.py: a device's memory)

    def __init__(self, cache):
        self.schedules = {}
        self.cache = cache                # runtime.cache.KernelCache
        self.functions = {}               # kernel key -> callable
        self.tuner = Tuner(self)
        self.stored = ScheduleStore(self)

    @property
    def target(self):
        """What this backend offers lowering (compiler/lower.py)."""
        return Target(self.renders, self.accumulator_registers, self.read_slack, flags.NUM_THREADS,
                      self.host_memory and bf16_gemm.available())

    # ---- what a code generator provides ---------------------------------------------------
    def render(self, kernels):
        """The source text of a batch of kernels."""
        raise NotImplementedError

    def compile(self, source_path, binary_path):
        """Build the source file into a loadable binary; raise CompileError with the tool's log."""
        raise NotImplementedError

    def open(self, binary_path, name):
        """The kernel `name` in a built binary, as a callable fn(arrays, error array); raises
        AttributeError when the binary has no such symbol (a stale or foreign binary)."""
        raise NotImplementedError

    # ---- shared --------------------------------------------------------------------------
    def load(self, kernels, origins=()):
        """(callables, sources) for the kernels, compiling the ones no cache holds (`origins`, a
        provenance.Origin per kernel, head a compiled file as a comment). An entry whose binary
        lacks its kernel (stale or foreign: its hash cannot tell) is rebuilt and counted as a
        compile, as a corrupt one is."""
        report = profiler.current()
        sources = [self.render([kernel]) for kernel in kernels]
        keys = [self.cache.key(source) for source in sources]
        wanted = list({key: i for i, key in enumerate(keys) if key not in self.functions}.values())
        missing = [i for i in wanted if self.cache.find(keys[i]) is None]
        described = {kernel.name: found for kernel, found in zip(kernels, origins)}
        self._compile([kernels[i] for i in missing], [keys[i] for i in missing], described)
        compiled = set(missing)
        stale = [i for i in wanted if not self._open(kernels[i], keys[i], None if i in compiled else report)]
        self._compile([kernels[i] for i in stale], [keys[i] for i in stale], described)
        for i in stale:
            if not self._open(kernels[i], keys[i]):
                raise CompileError(f"kernel {kernels[i].name} is missing from the binary just built "
                                   f"for it in {self.cache.directory}")
        if report is not None:
            report.compiles += len(missing) + len(stale)
            report.cache_hits += len(kernels) - len(missing) - len(stale)
        return [self.functions[key] for key in keys], sources

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

    def stored_function(self, key, name):
        """The callable of the cached kernel with `key` and `name`, or None if the cache lacks it."""
        if key not in self.functions:
            path = self.cache.find(key)
            if path is None or not self._opened(key, path, name):
                return None
        return self.functions[key]

    def _opened(self, key, path, name):
        """Load kernel `name` of the binary at `path` into self.functions under `key`; False when
        the binary lacks it (a stale or foreign binary: its hash cannot tell)."""
        try:
            self.functions[key] = self.open(path, name)
        except AttributeError:
            return False
        return True

    def _open(self, kernel, key, report=None):
        """Load a cached kernel into self.functions; False when its binary lacks the kernel. The
        load is an event of `report` (a profile) when given."""
        start = time.perf_counter()
        path = self.cache.find(key)
        if path is None:
            raise CompileError(f"kernel {kernel.name} vanished from the cache directory "
                               f"{self.cache.directory}")
        if not self._opened(key, path, kernel.name):
            return False
        if report is not None:
            report.record("load", kernel.name, start, time.perf_counter() - start, path=path)
        return True

    def _compile(self, kernels, keys, described):
        """Compile new kernels: one batch per job, the jobs running at once. A batch's source
        file begins with what `described` (kernel name -> provenance.Origin) says of its kernels,
        outside the text their keys hash."""
        if not kernels:
            return
        groups = max(1, min(self.compile_jobs, len(kernels)))
        batches = [(kernels[g::groups], keys[g::groups]) for g in range(groups)]
        report = profiler.current()

        def build(batch):
            start = time.perf_counter()
            source = self.render(batch[0])
            named = [(kernel.name, described[kernel.name]) for kernel in batch[0] if kernel.name in described]
            if named:
                source = provenance.header(named, self.comment) + source
            path, _ = self.cache.build(source, batch[1], self.compile)
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

    def memory_for(self, outputs):
        """The memory (executor.HostMemory's methods) that the graph computing `outputs` runs in."""
        return self.memory

    def realize(self, outputs):
        began = time.perf_counter()
        graph = pending_graph(outputs)
        key = (graph.key, flags.LIBRARY)
        entry = self.schedules.get(key)
        if entry is None:
            entry = self._stored_schedule(graph)
        if entry is None:
            steps = schedule(graph, self.target, bool(flags.LIBRARY),
                             tuned=self.tuner.get if flags.TUNE else None)
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
            try:
                compiled = zip(*self.load([step.kernel for step in steps if step.library is None],
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
        if key not in self.schedules:
            if len(self.schedules) >= SCHEDULE_CACHE_SIZE:
                self.schedules.pop(next(iter(self.schedules)))
            self.schedules[key] = entry
        entry.runs += 1
        seconds = [] if self.tuner.wanted(entry.runs) else None
        if entry.dead is None:
            last = executor.last_uses(entry.steps)
            entry.dead = executor.dead_after(entry.steps, graph.outputs, last)
            entry.donations = donation.Plan(graph, entry.steps, last)
            entry.reads = executor.external_reads(entry.steps, graph.outputs)
        # tuning reads its kernels' inputs after the run; checking reads every step's
        keep = frozenset() if seconds is None else self.tuner.inputs(entry.steps)
        report = profiler.current()
        memory = self.memory_for(outputs)
        donations = None if flags.CHECK or memory is not executor.HOST else entry.donations   # host buffers
        buffers = executor.run(graph, entry.steps, entry.functions, entry.sources,
                               oracle=check_against_oracle if flags.CHECK else None, seconds=seconds,
                               explain=explain_failure, dead=None if flags.CHECK else entry.dead,
                               donations=donations, keep=keep, memory=memory, reads=entry.reads,
                               origins=entry.origins(graph) if report is not None or flags.DEBUG else None)
        if seconds is not None:
            names = [step.name for step in entry.steps]
            self.tuner.tune(graph, entry, buffers, seconds)
            if names != [step.name for step in entry.steps]:
                self.stored.save(graph, entry.steps, entry.sources)
        # Values that autograd keeps anyway keep their buffers too, so that reading the loss after
        # optimizer.step() (or a gradient after the loss) does not compute the forward pass again.
        for step in entry.steps:
            node = graph.nodes[step.positions[0]]
            if node.requires_grad and node.buffer is None:
                node.set_buffer(buffers[step.positions[0]])
        if report is not None:
            path, line = provenance.line_of(user_site(sys._getframe(1)))
            report.record("realise", "realise", began, time.perf_counter() - began, at=f"{path}:{line}",
                          values=len(graph.outputs), kernels=len(entry.steps))
        return [buffers[k] for k in graph.outputs]


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
