"""What every code generator shares: its templates, the launcher of a native kernel, when an
outer loop is worth threads, and the base class of a code generator.

A code generator subclasses CompiledBackend and provides `render(kernels)` (one source text for a
batch), `compile(source_path, binary_path)` and `open(binary_path, kernel_name)` (the launch),
plus what its target offers lowering; the realisation pipeline (pipeline/realize.py) schedules,
keys each kernel by its rendered source, compiles the missing ones in batches, loads and launches
them.
"""
import functools
import os

import jinja2

from metagraph import flags
from metagraph.codegen import bf16_gemm
from metagraph.compiler import ir
from metagraph.compiler.generic import RuntimeExtent
from metagraph.compiler.lower import Target
from metagraph.compiler.heuristic import ACC_REGISTERS
from metagraph.errors import CompileError, MetagraphError, at  # noqa: F401  (the backends import it here)
from metagraph.runtime import executor

PARALLEL_WORK = 1 << 15     # loop nests with less work than this run on one thread


_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def template(name):
    """A code generator's Jinja template from codegen/templates."""
    return _TEMPLATES.get_template(name)


def launcher(ffi, native):
    """The callable fn(arrays, error array) for a native `void kernel(char **args, int64_t *err)`.
    The cffi types are looked up once per kernel, not per call (1 us of a launch's 1.9). Its
    `address` (the function's) lets a replayed schedule call it from native code
    (runtime/replay.py)."""
    args_type, error_type = ffi.typeof("char *[]"), ffi.typeof("int64_t[]")
    new, from_buffer = ffi.new, ffi.from_buffer

    def launch(arrays, error):
        native(new(args_type, [from_buffer(a) for a in arrays]), from_buffer(error_type, error))
    launch.address = int(ffi.cast("uintptr_t", native))
    return launch


@functools.lru_cache(maxsize=None)
def l2_bytes():
    """A core's second-level cache in bytes as Linux reports it (sysfs), or 1 MiB where it does not:
    what lowering sizes the copies a kernel keeps in it by (lower.Target.l2_bytes)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(os.path.join(base, index, "level")) as level:
                if level.read().strip() != "2":
                    continue
            with open(os.path.join(base, index, "size")) as size:
                text = size.read().strip().upper()
            return int(text.rstrip("KM")) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    except (OSError, ValueError):
        pass
    return 1 << 20


def worth_threads(loop):
    """Whether an outer loop is spread over threads (or tasks): parallel, and enough work."""
    return loop.kind == ir.PARALLEL and loop.extent >= 2 and work(loop) >= PARALLEL_WORK


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


def local_only(statements):
    """Whether top-level statements define local arrays or accumulators and write no memory (a sum
    hoisted out of a parallel loop): a code generator whose threads or tasks keep locals apart
    (llvm's functions, bang's NRAM) has each thread compute them for itself."""
    return any(isinstance(s, ir.Define) for s in statements) and not _writes_memory(statements)


def _writes_memory(statements):
    return any(isinstance(s, (ir.Store, ir.ScatterAccumulate)) or
               isinstance(s, ir.Loop) and _writes_memory(s.body) for s in statements)


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


def work(loop, runtime=None):
    """Iterations of a loop nest: the loop's extent times its largest inner loop's work; a loop of
    a run-time extent (compiler/generic.py) counted as `runtime` iterations when that is given."""
    inner = [s for s in loop.body if isinstance(s, ir.Loop)]
    extent = runtime if runtime is not None and isinstance(loop.extent, RuntimeExtent) else int(loop.extent)
    return extent * max([work(s, runtime) for s in inner] or [1])


class CompiledBackend:
    """A code generator: render, compile and open (launch) kernels, and the target lowering
    makes them for."""
    name = None
    compile_jobs = flags.NUM_THREADS     # toolchain calls that may run at once
    renders = None      # the table ops this backend renders (None: every row); lowering decomposes
                        # the others (compiler/decompose.py)
    accumulator_registers = ACC_REGISTERS   # vector registers a register tile may fill
    read_slack = executor.SLACK_BYTES       # bytes past a buffer's end that kernels may read
    host_memory = False     # buffers are host arrays: bfloat16 matmuls may run on the host's kernel
    comment = "//"          # how a line comment begins in the generated source
    memory = executor.HOST  # where kernels find their buffers (runtime/opencl.py: a device's memory)
    tunable = True          # tuning may time variants of its kernels on the run's host buffers
    runtime_extents = False     # kernels may take their outer extent at run time (compiler/generic.py)
    shared_sums = False     # it runs a loop of sums (ir.SHARED_SUM) on threads: lowering marks them

    def __init__(self, cache):
        self.cache = cache                # runtime.cache.KernelCache

    @property
    def target(self):
        """What this backend offers lowering (compiler/lower.py)."""
        return Target(self.renders, self.accumulator_registers, self.read_slack, flags.NUM_THREADS,
                      self.host_memory and bf16_gemm.available(), l2_bytes=l2_bytes(),
                      shared_sums=self.shared_sums)

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

    def memory_for(self, outputs):
        """The memory (executor.HostMemory's methods) that the graph computing `outputs` runs in."""
        return self.memory
