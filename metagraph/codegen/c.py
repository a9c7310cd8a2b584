"""The `c` backend: kernel IR rendered to C99 + OpenMP, compiled by the system C compiler, loaded
through cffi (ABI mode: one shared object per batch of new kernels, one compiler call).

Templates hold the structure (loops, signatures); the scalar expression of each op comes from
the tables below.
"""
import ctypes
import math
import os
import subprocess

import cffi
import numpy as np

from metagraph import dtypes, flags
from metagraph.codegen.compiled import (CompileError, CompiledBackend, fused_product, launcher, template,
                                        worth_threads)
from metagraph.compiler import ir
from metagraph.compiler.simplify import value_range
from metagraph.expr import Const, Extra, Select, Var, variables
from metagraph.runtime import profiler
from metagraph.runtime.cache import KernelCache

CTYPE = {"bool": "uint8_t", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
         "int64": "int64_t", "float16": "_Float16", "bfloat16": "uint16_t", "float32": "float",
         "float64": "double"}   # bfloat16 is its bits: C has no arithmetic type for it (GCC 12)

MATH = {"sqrt": "sqrt", "exp2": "exp2", "log2": "log2", "sin": "sin", "cos": "cos", "pow": "pow"}
INLINE_FLOAT_MATH = {"exp2": "mg_exp2"}   # float32 through c_helpers.j2's, not libm's
FMA = {dtypes.float32: "fmaf", dtypes.float64: "fma"}
BINARY = {"add": "({0} + {1})", "mul": "({0} * {1})", "cmplt": "({0} < {1})", "cmpne": "({0} != {1})",
          "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})"}
BOOL_BINARY = {"add": "({0} | {1})", "mul": "({0} & {1})"}
INDEX_OPS = {"+": "+", "-": "-", "*": "*", "<": "<", "<=": "<=", "==": "==", "!=": "!=", "&&": "&&",
             "||": "||"}
THREADS = flags.NUM_THREADS


def scalar(value, dtype):
    """A C literal of `dtype`."""
    if dtype == dtypes.bool_:
        return "1" if value else "0"
    if dtype == dtypes.bfloat16:
        return f"((uint16_t)0x{int(np.array(value, dtype.np).view(np.uint16)):04x})"
    if dtype.is_int:
        value = int(value)
        if dtype == dtypes.int64 and value == -2 ** 63:
            return "(-INT64_C(9223372036854775807) - 1)"
        return f"INT64_C({value})" if dtype == dtypes.int64 else f"(({CTYPE[dtype.name]}){value})"
    value = float(value)
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "(-INFINITY)"
    else:
        text = repr(value)
    return f"(({CTYPE[dtype.name]}){text})"


class Renderer:
    """Renders one kernel's IR to the pieces the template lays out."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.extents = kernel.extents
        self.temporaries = 0        # numbered per kernel: two statements may share a scope
        self.accumulators = {}

    def index(self, expr):
        """An index expression as C (int64 arithmetic, floor semantics where signs need it)."""
        if isinstance(expr, Var):
            return f"i{expr.axis}"
        if isinstance(expr, Const):
            return f"INT64_C({expr.value})" if abs(expr.value) >= 2 ** 31 else str(expr.value)
        if isinstance(expr, Select):
            return f"({self.index(expr.cond)} ? {self.index(expr.a)} : {self.index(expr.b)})"
        if isinstance(expr, Extra):
            offset = ir.extra_offset(self.kernel.params[expr.index], expr.args)
            return f"((int64_t)p{expr.index}[{self.index(offset)}])"
        a, b = self.index(expr.a), self.index(expr.b)
        if expr.op in ("//", "%"):
            if isinstance(expr.b, Const) and expr.b.value > 0 and value_range(expr.a, self.extents)[0] >= 0:
                return f"({a} {'/' if expr.op == '//' else '%'} {b})"
            low, high = value_range(expr.b, self.extents)
            if low > 0 or high < 0:
                return f"{'mg_floordiv' if expr.op == '//' else 'mg_floormod'}({a}, {b})"
            return f"{'mg_index_div' if expr.op == '//' else 'mg_index_mod'}({a}, {b}, err)"
        if expr.op in ("min", "max"):
            compare = "<" if expr.op == "min" else ">"
            return f"(({a}) {compare} ({b}) ? ({a}) : ({b}))"
        return f"({a} {INDEX_OPS[expr.op]} {b})"

    def value(self, value, lines, names):
        """C for a value; non-trivial subexpressions become temporaries appended to `lines`."""
        if id(value) in names:
            return names[id(value)]
        if isinstance(value, ir.Scalar):
            return scalar(value.value, value.dtype)
        if isinstance(value, ir.Ref):
            return value.name if value.index is None else f"{value.name}[{self.index(value.index)}]"
        if isinstance(value, ir.IndexValue):
            text = f"(({CTYPE[value.dtype.name]})({self.index(value.expr)}))"
            dtype = value.dtype
        elif isinstance(value, ir.Load):
            text = f"p{value.param}[{self.index(value.index)}]"
            stored = self.kernel.params[value.param].dtype
            if stored == dtypes.bfloat16 and value.dtype != stored:     # read as float32
                text = f"mg_bf16_to_f32({text})"
            elif stored != value.dtype:                                 # float16 read as float32
                text = f"(({CTYPE[value.dtype.name]}){text})"
            if value.valid is not None:
                text = f"({self.index(value.valid)} ? {text} : 0)"
            dtype = value.dtype
        elif isinstance(value, ir.Guard):
            inner = self.value(value.value, lines, names)
            dtype = value.value.dtype
            cond = self.index(value.cond)
            if value.valid is not None:
                cond = f"(!{self.index(value.valid)} || {cond})"
            fill = scalar(value.fill, dtype)
            otherwise = f"(mg_fail(err, {value.check}), {fill})" if value.check else fill
            text = f"({cond} ? {inner} : {otherwise})"
        else:
            args = [self.value(arg, lines, names) for arg in value.args]
            text, dtype = self.apply(value, args), value.dtype
        name = f"t{self.temporaries}"
        self.temporaries += 1
        names[id(value)] = name
        lines.append(f"{CTYPE[dtype.name]} {name} = {text};")
        return name

    def apply(self, value, args):
        op, dtype = value.op, value.dtype
        source = value.args[0].dtype if value.args else dtype
        if op == "neg":
            return f"(-{args[0]})"
        if op == "recip":
            return f"({scalar(1, dtype)} / {args[0]})"
        if op in MATH:      # float16 and bfloat16 math is float32's (compiler/decompose.py)
            if dtype != dtypes.float32:
                return f"{MATH[op]}({', '.join(args)})"
            return f"{INLINE_FLOAT_MATH.get(op, MATH[op])}f({', '.join(args)})"
        if op == "cast":
            x = f"mg_bf16_to_f32({args[0]})" if source == dtypes.bfloat16 else args[0]
            if dtype == dtypes.bool_:
                return f"({x} != 0)"
            if dtype == dtypes.bfloat16:
                return f"mg_f32_to_bf16((float){x})"
            return f"(({CTYPE[dtype.name]}){x})"
        if op == "max":
            a, b = args
            nan = f"{a} != {a} || " if source.is_float else ""
            return f"(({nan}{a} > {b}) ? {a} : {b})"
        if op == "where":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if op in ("idiv", "mod"):
            helper = "mg_idiv" if op == "idiv" else "mg_imod"
            return f"(({CTYPE[dtype.name]}){helper}({args[0]}, {args[1]}, err, {value.site}))"
        if source == dtypes.bool_ and op in BOOL_BINARY:
            return BOOL_BINARY[op].format(*args)
        return BINARY[op].format(*args)

    def statement(self, s, names=None):
        """A statement as a dict the template understands (`names`: values already computed by
        earlier statements of the same loop body)."""
        if isinstance(s, ir.Loop):
            pragma, after = self.pragma(s)
            # register-blocked accumulations share their operands: one set of names for the body
            shared = {} if all(isinstance(b, ir.Accumulate) and b.index is not None for b in s.body) else None
            before = []
            if s.kind == ir.VECTOR and shared is not None:
                for load in _invariant_loads(s):
                    self.value(load, before, shared)
                branches = self.branches(s, shared)
                if branches is not None:
                    return {"kind": "group", "lines": before, "body": branches}
            return {"kind": "loop", "var": s.var, "extent": s.extent, "pragma": pragma, "after": after,
                    "before": before, "body": [self.statement(b, shared) for b in s.body]}
        lines, names = [], {} if names is None else names
        if isinstance(s, ir.Define):
            acc_type = CTYPE[s.dtype.name]
            if s.size is not None and s.init is None:
                # a staging array (a packed operand, a cached row), used only through a restrict
                # pointer: GCC 12 otherwise assumed it might alias the register tile's accumulator
                # array and kept that in memory (a linear layer's transposed panel: 44 -> 80 GFLOP/s)
                lines.append(f"{acc_type} {s.name}_data[{s.size}] __attribute__((aligned(64)));")
                lines.append(f"{acc_type} *restrict {s.name} = __builtin_assume_aligned({s.name}_data, 64);")
            elif s.size is not None:
                # explicitly aligned: GCC 12 otherwise placed it misaligned under an aligned store
                lines.append(f"{acc_type} {s.name}[{s.size}] __attribute__((aligned(64)));")
                if s.init is not None:
                    init = scalar(s.init, s.dtype)
                    lines.append(f"for (int64_t q = 0; q < {s.size}; q++) {s.name}[q] = {init};")
            else:
                lines.append(f"{acc_type} {s.name} = {scalar(s.init, s.dtype)};")
                if s.op == "max" and s.dtype.is_float:
                    # a flag as wide as the value: GCC packs a uint8_t one from the compare's
                    # lanes at every step (softmax 4096x1024: 2.29 -> 2.18 ms)
                    lines.append(f"{'int32_t' if s.dtype.itemsize <= 4 else 'int64_t'} {s.name}_nan = 0;")
            self.accumulators[s.name] = s
        elif isinstance(s, ir.Accumulate) and s.index is not None:
            target = f"{s.name}[{self.index(s.index)}]"
            product = fused_product(s, self.accumulators[s.name].dtype)
            if product is not None:
                a, b = (self.value(arg, lines, names) for arg in product[:2])
                fma = f"{FMA[self.accumulators[s.name].dtype]}({a}, {b}, {target})"
                if product[2] is not None:
                    fma = f"{self.index(product[2])} ? {fma} : {target}"
                lines.append(f"{target} = {fma};")
            else:
                v = self.value(s.value, lines, names)
                lines.append(self.combine(target, s.op, v, s.value.dtype))
        elif isinstance(s, ir.Accumulate):
            v = self.value(s.value, lines, names)
            if s.op == "max" and self.accumulators[s.name].dtype.is_float:
                lines.append(f"{s.name}_nan |= ({v} != {v});")      # NaN wins, apart from the max
                lines.append(f"if ({v} > {s.name}) {s.name} = {v};")
            else:
                lines.append(self.combine(s.name, s.op, v, s.value.dtype))
        elif isinstance(s, ir.Store):
            v = self.value(s.value, lines, names)
            lines.append(f"p{s.param}[{self.index(s.index)}] = {v};")
        elif isinstance(s, ir.Assign):
            v = self.value(s.value, lines, names)
            lines.append(f"{s.name}[{self.index(s.index)}] = {v};")
        elif isinstance(s, ir.ScatterAccumulate):
            v = self.value(s.value, lines, names)
            target = f"p{s.param}[{self.index(s.index)}]"
            update = self.combine(target, s.op, v, s.value.dtype)
            if self.kernel.params[s.param].dtype == dtypes.bfloat16:     # float32 math, rounded back
                combined = self.combine("mg_sum", s.op, v, s.value.dtype)
                update = f"{{ float mg_sum = mg_bf16_to_f32({target}); {combined} " \
                         f"{target} = mg_f32_to_bf16(mg_sum); }}"
            if s.valid is None:
                lines.append(update)
            else:
                fail = f" else {{ *err = {s.check}; }}" if s.check else ""
                lines.append(f"if ({self.index(s.valid)}) {{ {update} }}{fail}")
        return {"kind": "lines", "lines": lines}

    @staticmethod
    def combine(target, op, v, dtype):
        if op == "add":
            return f"{target} {'|' if dtype == dtypes.bool_ else '+'}= {v};"
        if op == "mul":
            return f"{target} {'&' if dtype == dtypes.bool_ else '*'}= {v};"
        nan = f"{v} != {v} || " if dtype.is_float else ""
        return f"if ({nan}{v} > {target}) {target} = {v};"

    def branches(self, loop, shared):
        """A register block's vector loop as one loop per accumulation, inside `if` its condition
        where it has one, when the masked multiply-adds' conditions are the same for all lanes (a
        channel tile's, along the window's border). GCC 12 does not vectorise a select on a
        condition that does not vary along the loop: 7.6 ms per call as scalar code, 1.5 as
        branches (ResNet-18's input gradient over a 4x4 plane). None otherwise."""
        products = [fused_product(b, self.accumulators[b.name].dtype) for b in loop.body]
        if any(p is None or p[2] is not None and loop.var in variables(p[2]) for p in products) or \
                all(p[2] is None for p in products):
            return None
        branches = []
        for b, (_, _, cond) in zip(loop.body, products):
            unmasked = b if cond is None else ir.Accumulate(b.name, b.op, b.value.value, b.index)
            inner = {"kind": "loop", "var": loop.var, "extent": loop.extent, "pragma": "simd", "after": [],
                     "before": [], "body": [self.statement(unmasked, dict(shared))]}
            if cond is not None:
                inner = {"kind": "if", "cond": self.index(cond), "body": [inner]}
            branches.append(inner)
        return branches

    def pragma(self, loop):
        """(pragma, lines after the loop): threads for outer loops, SIMD for innermost reductions."""
        if loop.kind == ir.VECTOR:
            return "simd", []
        accumulate = [s for s in loop.body if isinstance(s, ir.Accumulate) and s.index is None]
        if loop.kind == ir.REDUCE and accumulate:
            clauses, after = ["simd"], []      # every accumulator (jammed dot products have several)
            for name in dict.fromkeys(s.name for s in accumulate):
                acc = self.accumulators[name]
                symbol = {"add": "+", "mul": "*", "max": "max"}[acc.op]
                if acc.dtype == dtypes.bool_:
                    symbol = {"add": "|", "mul": "&", "max": "|"}[acc.op]
                clauses.append(f"reduction({symbol}:{name})")
                if acc.op == "max" and acc.dtype.is_float:
                    clauses.append(f"reduction(|:{name}_nan)")
                    after.append(f"if ({name}_nan) {name} = NAN;")
            return " ".join(clauses), after
        if not worth_threads(loop):
            return None, []
        return f"parallel for schedule(static) num_threads({THREADS})", []


def _invariant_loads(loop):
    """The unconditional loads in a vector loop's body that do not vary along it. They are read
    before the loop: GCC 12 otherwise sinks a weight read into a masked multiply-add's branch and
    then cannot vectorise the masked load of one address (a guarded conv input gradient ran
    scalar, 11 GFLOP/s; 34 with its weights read first)."""
    found = {id(load): load for statement in loop.body for load in ir.loads(statement.value)
             if load.valid is None and loop.var not in variables(load.index)}
    return list(found.values())


_TEMPLATE = template("c.j2")


def render(kernels, vector_math=True):
    """C source for a batch of kernels (vector_math: declare libmvec's SIMD math functions)."""
    views = []
    for kernel in kernels:
        renderer = Renderer(kernel)
        params = [{"ctype": CTYPE[p.dtype.name], "output": p.output, "shared": p.shared}
                  for p in kernel.params]
        views.append({"name": kernel.name, "params": params,
                      "body": [renderer.statement(s) for s in kernel.body]})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], vector_math=vector_math)


def compiler_command():
    """The C compiler to use: $CC, else cc."""
    return os.environ.get("CC") or "cc"


# Not -O3: GCC 12.2 at -O3 -march=znver3 miscompiles a conditional sum in an inner loop (the values
# of max(dim) read back through their indices: docs/architecture.md keeps the reproducer). -O2 with
# the vectorizer at its -O3 cost model keeps the vectorisation without those extra loop transforms.
# -fpeel-loops unrolls a register tile's short vector loop completely, so its accumulator lives
# in registers (a hand-written 8x32 matmul 1024^3 tile: 49 GFLOP/s without it, 174 with it).
COMPILE_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-fpeel-loops", "-march=native",
                 "-fPIC", "-shared", "-fopenmp", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
                 "-std=gnu11", "-pipe"]


def compile_shared(source_path, output_path, libraries=("-lmvec", "-lm"), include=None):
    """Compile one C file into a shared object; raise CompileError with the compiler's output."""
    command = [compiler_command(), *COMPILE_FLAGS, *([f"-I{include}"] if include else []), source_path,
               "-o", output_path, *libraries]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CompileError(f"could not run the C compiler {command[0]!r}: {error}") from None
    if result.returncode != 0:
        log_path = source_path + ".log"
        with open(log_path, "w") as log:
            log.write(" ".join(command) + "\n" + result.stdout + result.stderr)
        raise CompileError(f"the C compiler failed on {source_path} (its output is in {log_path}):\n"
                           f"{result.stderr[-2000:]}")


def toolchain_identity():
    """What goes into the cache key besides the source: compiler, version, flags, target CPU."""
    command = compiler_command()
    try:
        version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60).stdout
        target = subprocess.run([command, "-march=native", "-Q", "--help=target"], capture_output=True,
                                text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CompileError(f"no working C compiler {command!r}: {error}") from None
    march = [line.split()[-1] for line in target.splitlines() if line.strip().startswith("-march=")]
    cpu_flags = ""
    try:
        with open("/proc/cpuinfo") as info:
            cpu_flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        pass
    return "\n".join([command, version.splitlines()[0] if version else "", " ".join(COMPILE_FLAGS),
                      ",".join(march), cpu_flags])


def probe_vector_math(backend):
    """Compile a trivial kernel once, so that a broken compiler is found before any real work;
    without glibc's vector math library (libmvec), math calls stay scalar. Sets the backend's
    `vector_math` and `libraries`."""
    backend.vector_math, backend.libraries = True, ("-lmvec", "-lm")
    with profiler.suspended():
        try:
            backend.load([ir.Kernel("probe_kernel", [], [])])
        except CompileError:
            backend.vector_math, backend.libraries = False, ("-lm",)
            backend.load([ir.Kernel("probe_kernel", [], [])])


class SharedObjects:
    """Kernels in shared objects, loaded through cffi's ABI mode as fn(arrays, error array).

    A shared object is opened with RTLD_NODELETE: it stays mapped until the process ends, and so
    does the OpenMP runtime it links. Otherwise, at interpreter exit, freeing the last library
    object unmaps the runtime while its idle worker threads still spin in its code, and the
    process dies of SIGSEGV after its work is done."""

    def __init__(self):
        self.ffi = cffi.FFI()
        self.opened = {}

    def open(self, path, name):
        """The kernel `name` of shared object `path`, found by ctypes and called through a cffi
        function pointer: declaring each name to cffi instead (a pycparser parse) cost 0.2 ms a
        kernel, a tenth of a second to load ResNet-18's training step."""
        if path not in self.opened:
            self.opened[path] = ctypes.CDLL(path, os.RTLD_NOW | os.RTLD_NODELETE)
        address = ctypes.cast(getattr(self.opened[path], name), ctypes.c_void_p).value
        return launcher(self.ffi, self.ffi.cast("void (*)(char **, int64_t *)", address))


class CBackend(CompiledBackend):
    """Kernels as C, compiled by the system C compiler in batches, loaded through cffi."""
    name = "c"
    host_memory = True       # bfloat16 matmuls through codegen/bf16_gemm.py

    def __init__(self):
        super().__init__(KernelCache(flags.CACHE_DIR, toolchain_identity()))
        self.objects = SharedObjects()
        probe_vector_math(self)

    def render(self, kernels):
        return render(kernels, self.vector_math)

    def compile(self, source_path, binary_path):
        compile_shared(source_path, binary_path, self.libraries)

    def open(self, path, name):
        return self.objects.open(path, name)
