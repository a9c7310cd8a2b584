"""The `opencl` backend: kernel IR rendered to OpenCL C, built by the device's driver through
pyopencl, run on the device's queue with the device's memory (runtime/opencl.py).

What is OpenCL's own here is small: the op table (opencl_ops.py: the C family's, with OpenCL's
variants), float16 loads and stores, how a kernel's loops become work-items, and build and launch.
The walk over the IR is codegen/walker.py's, spelt as C by the C family's renderer
(codegen/clike.py), whose C the template's first lines make OpenCL C.

A kernel's top-level statements become phases, OpenCL kernels launched in order: each top-level
parallel loop is one, its perfectly nested loops spread over work-items with it (one work-item
per iteration); statements between them run on one work-item. A kernel with an accumulator at
its top level (a reduction to one value) is one phase on one work-item. Every phase's name says
how to launch it: `<kernel>__<phase>_<work-items>_<group size>_<checks>`.
"""
import math
import re
import threading

import numpy as np

from metagraph import dtypes, flags
from metagraph.codegen import clike
from metagraph.codegen.compiled import CompileError, CompiledBackend, template, thread_groups
from metagraph.codegen.opencl_ops import NARROW, OPS, UNSIGNED, WIDEN
from metagraph.compiler import ir
from metagraph.errors import Unsupported
from metagraph.runtime import opencl, profiler
from metagraph.runtime.cache import KernelCache

HALF = dtypes.float16
POINTER = dict(clike.CTYPE, float16="half")     # float16 buffers are read by vload_half
GROUP_MAX = 64          # work-items per work-group, at most
LANES = 16              # partial sums of a reduction loop (Renderer.loop): a power of two
# the math rounds as IEEE's (division and sqrt included), no fast-math relaxations; no warnings
# (clang's on generated code, `x && 1`, came back as Python warnings through pyopencl)
BUILD_OPTIONS = ["-cl-std=CL1.2", "-cl-fp32-correctly-rounded-divide-sqrt", "-w"]


class Renderer(clike.Renderer):
    """One kernel's IR as OpenCL C: C's spelling of the walk with this backend's tables, float16
    memory through vload_half/vstore_half_rte, float sums in lanes."""
    OPS, WIDEN, NARROW = OPS, WIDEN, NARROW

    def __init__(self, kernel):
        super().__init__(kernel)
        self.lanes = {}         # accumulator summed in lanes -> the expression that picks the lane

    def fields(self, source, dtype):
        return dict(super().fields(source, dtype), f="", unsigned=UNSIGNED.get(dtype.name))

    def element(self, param, index):
        if self.params[param].dtype == HALF:
            return f"vload_half({index}, p{param})"
        return super().element(param, index)

    def write(self, param, index, v):
        if self.params[param].dtype == HALF:      # rounded once
            return f"vstore_half_rte({v}, {index}, p{param});"
        return super().write(param, index, v)

    def accumulate(self, define, index, op, v, dtype):
        if define.name in self.lanes:
            return f"{define.name}_lane[{self.lanes[define.name]}] += {v};"
        return super().accumulate(define, index, op, v, dtype)

    def loop(self, loop, names):
        """A loop as C's, but a reduction loop's float sums add into LANES partial sums (the
        iteration modulo LANES picks one), summed pairwise after it, as the C backend's vectorised
        sums are: the blocks of compiler/cascade.py (1024 terms) keep a float32 sum within 2e-6
        only so (one running sum of 2^24 terms 0.1 was 1e-5 off). Where LANES divides the extent the
        loop is blocks of LANES iterations, one a lane: PoCL vectorises that inner loop, the math
        in it too (a row softmax's exponentials: 28 -> 12 ms over 4096x1024), where it left the
        lane picked by `i & 15` scalar."""
        sums = [] if loop.kind != ir.REDUCE or loop.extent < 2 * LANES else list(dict.fromkeys(
            s.name for s in loop.body if isinstance(s, ir.Accumulate) and s.index is None and s.op == "add"
            and self.accumulators[s.name].dtype.is_float))
        blocked = bool(sums) and loop.extent % LANES == 0
        lane = f"i{loop.var}_lane" if blocked else f"i{loop.var} & {LANES - 1}"
        self.lanes.update((name, lane) for name in sums)
        rendered = super().loop(loop, names)
        if blocked:
            index = f"const int64_t i{loop.var} = i{loop.var}_block * {LANES} + {lane};"
            inner = dict(rendered, var=f"{loop.var}_lane", extent=LANES, before=[], after=[],
                         body=[{"kind": "lines", "lines": [index]}] + rendered["body"])
            rendered = dict(rendered, var=f"{loop.var}_block", extent=loop.extent // LANES, body=[inner])
        for name in sums:
            del self.lanes[name]
            partial = [f"{name}_lane[{lane}]" for lane in range(LANES)]
            while len(partial) > 1:
                partial = [f"({a} + {b})" for a, b in zip(partial[::2], partial[1::2])]
            ctype = clike.CTYPE[self.accumulators[name].dtype.name]
            rendered["before"].append(f"{ctype} {name}_lane[{LANES}] = {{0}};")
            rendered["after"].append(f"{name} += {partial[0]};")
        return rendered


def _spread(loop):
    """The loops spread over work-items from a top-level parallel loop: it and each loop that is
    the only statement of the one before (a serial one too: its iterations store apart, unless a
    scatter is inside), and the statements one work-item runs."""
    loops = [loop]
    scatter = _has_scatter(loop)
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], ir.Loop):
        inner = loops[-1].body[0]
        if inner.kind == ir.REDUCE or (scatter and inner.kind != ir.PARALLEL):
            break
        loops.append(inner)
    return loops, loops[-1].body


def _has_scatter(statement):
    if isinstance(statement, ir.ScatterAccumulate):
        return True
    return isinstance(statement, ir.Loop) and any(_has_scatter(s) for s in statement.body)


def _group_size(count, compute_units, group_max):
    """Work-items per work-group: up to GROUP_MAX (a power of two), fewer while there would be
    fewer than two groups per compute unit."""
    size = min(GROUP_MAX, group_max)
    while size > 1 and count < size * 2 * compute_units:
        size //= 2
    return size


def _phases(kernel, device):
    """The OpenCL kernels (as the template's dicts) that compute one IR kernel, in launch order."""
    renderer = Renderer(kernel)
    params = [{"ctype": POINTER[p.dtype.name], "output": p.output} for p in kernel.params]
    if any(isinstance(s, ir.Define) for s in kernel.body):
        groups = [(None, kernel.body)]
    else:       # every parallel loop is a launch of its own
        groups = thread_groups(kernel.body, lambda loop: loop.kind == ir.PARALLEL)
    phases = []
    for number, (loop, statements) in enumerate(groups or [(None, [])]):
        loops, statements = _spread(loop) if loop is not None else ([], statements)
        count = math.prod(inner.extent for inner in loops)
        dims, stride = [], 1
        for inner in reversed(loops):
            expr = "mg_id" if len(loops) == 1 else f"mg_id / {stride} % {inner.extent}"
            dims.insert(0, {"var": inner.var, "expr": expr.replace(" / 1 %", " %")})
            stride *= inner.extent
        body = str(_BLOCK([renderer.statement(s) for s in statements], 1))
        checks = re.search(r"\berr\b", body) is not None
        size = _group_size(count, device.compute_units, device.max_group)
        phases.append({"name": f"{kernel.name}__{number}_{count}_{size}_{int(checks)}", "params": params,
                       "dims": dims, "body": body, "checks": checks, "whole_groups": count % size == 0})
    return phases


# The C family's statement macro (its loops, lines and branches as the C renderer describes them):
# OpenCL C writes them as C does.
_BLOCK = template("clike.j2").module.block
_TEMPLATE = template("opencl.j2")


def render(kernels, device):
    """OpenCL C for a batch of kernels, for `device` (an opencl.Device)."""
    phases = [phase for kernel in kernels for phase in _phases(kernel, device)]
    source = _TEMPLATE.render(names=[k.name for k in kernels], phases=phases, fp64=device.fp64)
    if not device.fp64 and re.search(r"\bdouble\b", source):
        raise Unsupported(f"kernels {', '.join(k.name for k in kernels)} compute in float64, which the "
                          f"OpenCL device {device.name} does not support (no cl_khr_fp64)")
    return source


class Phase:
    """One OpenCL kernel of a compiled kernel, with its launch geometry (from its name)."""

    def __init__(self, kernel):
        self.kernel = kernel
        number, count, size, checks = kernel.function_name.rsplit("__", 1)[1].split("_")
        self.number, self.count, self.size, self.checks = int(number), int(count), int(size), checks == "1"
        self.global_size = -(-max(self.count, 1) // self.size) * self.size


class Launch:
    """A compiled kernel as executor.run calls it: fn(arrays, errors), its phases launched in order
    on the device's queue (errors: runtime.opencl.ErrorWords). It returns once they are queued,
    unless a profile or METAGRAPH_DEBUG times each launch: then once they have run."""

    def __init__(self, device, phases, lock):
        self.device, self.phases, self.lock = device, phases, lock

    def __call__(self, arrays, errors):
        buffers = [array.buffer for array in arrays]
        step = np.int64(errors.step + 1)
        with self.lock:         # a kernel's arguments are set, then it is enqueued: one thread at once
            for phase in self.phases:
                words = errors.buffer() if phase.checks else self.device.error_words().buffer
                phase.kernel.set_args(*buffers, np.int64(phase.count), words, step)
                self.device.cl.enqueue_nd_range_kernel(self.device.queue, phase.kernel, (phase.global_size,),
                                                       (phase.size,))
        if flags.DEBUG or profiler.current() is not None:
            self.device.queue.finish()


class OpenCLBackend(CompiledBackend):
    """Kernels as OpenCL C, built by the device's driver, run with the device's memory."""
    name = "opencl"
    # one build at a time: PoCL builds in one LLVM (two threads compiled no faster)
    compile_jobs = 1
    read_slack = 0          # a device buffer has nothing readable past its end
    tunable = False         # tuning times variants on host buffers, not a device's

    def __init__(self):
        self.device = opencl.Device()
        super().__init__(KernelCache(flags.CACHE_DIR, "opencl\n" + self.device.identity + "\n" +
                                     " ".join(BUILD_OPTIONS), ".cl", ".clbin"))
        self.on_device = opencl.DeviceMemory(self.device, to_host=False)
        self.on_host = opencl.DeviceMemory(self.device, to_host=True)
        self.programs = {}          # binary path -> its program, built for the device
        self.lock = threading.Lock()

    def memory_for(self, outputs):
        """Values of the `opencl` device stay in its memory; the `cpu` device's (when this is the
        active backend) are copied back to the host."""
        return self.on_device if outputs[0].device == "opencl" else self.on_host

    def render(self, kernels):
        return render(kernels, self.device)

    def compile(self, source_path, binary_path):
        """Build the program, then launch each kernel once on no work-items: the driver compiles a
        kernel for its work-group size at its first launch (PoCL: 70 ms each), and the binary then
        holds that code too."""
        cl = self.device.cl
        with open(source_path) as stream:
            source = stream.read()
        program = cl.Program(self.device.context, source)
        try:
            program.build(options=BUILD_OPTIONS, cache_dir=False)
        except cl.Error as error:
            log_path = source_path + ".log"
            with open(log_path, "w") as log:
                log.write(str(error))
            raise CompileError(f"the OpenCL driver failed to build {source_path} (its log is in "
                               f"{log_path}):\n{str(error)[-2000:]}") from None
        empty = self.device.allocate((1,), np.int64).buffer
        for kernel in program.all_kernels():
            phase = Phase(kernel)
            kernel.set_args(*[empty] * (kernel.num_args - 3), np.int64(0), empty, np.int64(0))
            cl.enqueue_nd_range_kernel(self.device.queue, kernel, (phase.size,), (phase.size,))
        self.device.queue.finish()
        with open(binary_path, "wb") as stream:
            stream.write(program.binaries[0])

    def open(self, path, name):
        cl = self.device.cl
        program = self.programs.get(path)
        if program is None:
            with open(path, "rb") as stream:
                binary = stream.read()
            try:
                program = cl.Program(self.device.context, [self.device.device], [binary])
                program.build(options=BUILD_OPTIONS)
            except cl.Error as error:         # not a binary this driver takes: rebuilt from source
                raise AttributeError(f"{path}: {str(error).splitlines()[0]}") from None
            self.programs[path] = program
        names = [n for n in program.kernel_names.split(";") if n.rsplit("__", 1)[0] == name]
        if not names:
            raise AttributeError(f"{path} has no kernel {name}")
        phases = sorted((Phase(cl.Kernel(program, n)) for n in names), key=lambda phase: phase.number)
        return Launch(self.device, phases, self.lock)
