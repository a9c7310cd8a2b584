"""The `c` backend: kernel IR rendered to C99 + OpenMP, compiled by the system C compiler, loaded
through cffi (codegen/toolchain.py: one shared object per batch of new kernels, one compiler call).

The walk over the IR is codegen/walker.py's; here are the op table (each meta-op's C expression),
C's spelling of values and statements (which the opencl and bang backends reuse), the loop
pragmas and vectorisation aids, and `templates/c.j2` holds the structure (loops, signatures).
The c backend's own renderer (CRenderer) holds float16 as its bits, converted by integer helpers.
"""
import math

import numpy as np

from metagraph import dtypes, flags
from metagraph.codegen.compiled import CompiledBackend, fused_product, template, worth_threads
from metagraph.codegen.toolchain import SharedObjects, compile_shared, probe_vector_math, toolchain_identity
from metagraph.codegen.walker import Walker, op_form
from metagraph.compiler import ir
from metagraph.expr import variables
from metagraph.runtime.cache import KernelCache

CTYPE = {"bool": "uint8_t", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
         "int64": "int64_t", "float16": "_Float16", "bfloat16": "uint16_t", "float32": "float",
         "float64": "double"}   # bfloat16 is its bits: C has no arithmetic type for it (GCC 12)
# the c backend's own types (bang's and opencl's renderers keep CTYPE): float16 is its bits too.
# GCC 12 converts _Float16 one element at a time and leaves the loop scalar (a*b + sigmoid(a) over
# 1M, one thread: 17.0 ms CPU time); c_helpers.j2's conversions are integer ops it vectorises (4.6)
HOST_CTYPE = dict(CTYPE, float16="uint16_t")

# the op table: meta-op (or (op, operand dtype or kind)) -> C; {type} the result's C type, {one}
# its 1, {f} "f" for float32 math (float16 and bfloat16 math is float32's: compiler/decompose.py)
OPS = {
    "neg": "(-{0})", "recip": "({one} / {0})", "sqrt": "sqrt{f}({0})", "exp2": "exp2{f}({0})",
    "log2": "log2{f}({0})", "sin": "sin{f}({0})", "cos": "cos{f}({0})", "pow": "pow{f}({0}, {1})",
    ("exp2", "float32"): "mg_exp2f({0})",       # c_helpers.j2's, inline: libm's is a call per element
    "add": "({0} + {1})", "mul": "({0} * {1})", "cmplt": "({0} < {1})", "cmpne": "({0} != {1})",
    "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})", "where": "({0} ? {1} : {2})",
    ("add", "bool"): "({0} | {1})", ("mul", "bool"): "({0} & {1})",
    "max": "(({0} > {1}) ? {0} : {1})", ("max", "float"): "(({0} != {0} || {0} > {1}) ? {0} : {1})",
    "idiv": "(({type})mg_idiv({0}, {1}, err, {site}))", "mod": "(({type})mg_imod({0}, {1}, err, {site}))",
}
# index ops (int64); divisions by the walker's choice of form (walker.division)
INDEX = {op: f"({{0}} {op} {{1}})" for op in ("+", "-", "*", "<", "<=", "==", "!=", "&&", "||")}
INDEX.update({"min": "(({0}) < ({1}) ? ({0}) : ({1}))", "max": "(({0}) > ({1}) ? ({0}) : ({1}))",
              ("//", "exact"): "({0} / {1})", ("%", "exact"): "({0} % {1})",
              ("//", "floor"): "mg_floordiv({0}, {1})", ("%", "floor"): "mg_floormod({0}, {1})",
              ("//", "checked"): "mg_index_div({0}, {1}, err)",
              ("%", "checked"): "mg_index_mod({0}, {1}, err)"})
# an accumulation's update: the statement, and the OpenMP reduction clause's operator
COMBINE = {"add": "{0} += {1};", "mul": "{0} *= {1};", "max": "if ({1} > {0}) {0} = {1};",
           ("add", "bool"): "{0} |= {1};", ("mul", "bool"): "{0} &= {1};",
           ("max", "float"): "if ({1} != {1} || {1} > {0}) {0} = {1};"}
REDUCTION = {"add": "+", "mul": "*", "max": "max", ("add", "bool"): "|", ("mul", "bool"): "&",
             ("max", "bool"): "|"}
FMA = {dtypes.float32: "fmaf", dtypes.float64: "fma"}
THREADS = flags.NUM_THREADS


def scalar(value, dtype):
    """A C literal of `dtype` (float16 as _Float16: see bits_literal for the c backend's)."""
    if dtype == dtypes.bool_:
        return "1" if value else "0"
    if dtype == dtypes.bfloat16:
        return bits_literal(value, dtype)
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


def bits_literal(value, dtype):
    """A float16 or bfloat16 constant held as its bits: `value` rounded to `dtype` once."""
    return f"((uint16_t)0x{int(np.array(value, dtype.np).view(np.uint16)):04x})"


class Renderer(Walker):
    """The walker's constructs spelt as C (also the spelling of the opencl and bang backends):
    values are temporaries, each statement a list of lines, loops the template's structures.
    Types are TYPES' (float16 as _Float16; the c backend's own renderer is CRenderer)."""
    OPS, INDEX, TYPES = OPS, INDEX, CTYPE

    def __init__(self, kernel):
        super().__init__(kernel)
        self.temporaries = 0        # numbered per kernel: two statements may share a scope

    # ---- spelling ----------------------------------------------------------------------------
    def fields(self, source, dtype):
        return {"type": self.TYPES[dtype.name], "one": self.literal(1, dtype),
                "f": "f" if dtype == dtypes.float32 else ""}

    def literal(self, value, dtype):
        return scalar(value, dtype)

    def zero(self, dtype):
        return "0"

    def bind(self, text, value):
        if isinstance(value, ir.Ref) or text.isidentifier():      # a name already (a conversion that is none)
            return text
        name = f"t{self.temporaries}"
        self.temporaries += 1
        self.emit(f"{self.TYPES[value.dtype.name]} {name} = {text};")
        return name

    def loop_variable(self, axis):
        return f"i{axis}"

    def integer(self, value):
        return f"INT64_C({value})" if abs(value) >= 2 ** 31 else str(value)

    def choose(self, cond, then, otherwise, dtype, lazy):
        return f"({cond} ? {then()} : {otherwise()})"

    def implies(self, valid, cond):
        return f"(!{valid} || {cond()})"

    def guarded(self, cond, inner, fill, check, dtype):
        return f"({cond} ? {inner} : {f'(mg_fail(err, {check}), {fill})' if check else fill})"

    def element(self, param, index):
        return f"p{param}[{index}]"

    def read_accumulator(self, name, index):
        return name if index is None else f"{name}[{index}]"

    def index_value(self, index, dtype):
        return f"(({self.TYPES[dtype.name]})({index}))"

    def convert(self, x, source, target):
        """C's conversion of `x` (bfloat16 values are their bits: through float32)."""
        if source is target:
            return x
        if source == dtypes.bfloat16:
            x = f"mg_bf16_to_f32({x})"
            if target == dtypes.float32:
                return x
        if target == dtypes.bool_:
            return f"({x} != 0)"
        if target == dtypes.bfloat16:
            return f"mg_f32_to_bf16({x if source == dtypes.float32 else f'(float){x}'})"
        return f"(({self.TYPES[target.name]}){x})"

    # ---- statements: each a list of lines (the temporaries, then the statement's own) ----------
    def statement(self, s, names=None):
        """A statement as the template's structure (`names`: values already computed by earlier
        statements of the same loop body)."""
        if isinstance(s, ir.Loop):
            return super().statement(s, names)
        self.lines = []
        line = super().statement(s, names)
        if line:
            self.emit(line)
        return {"kind": "lines", "lines": self.lines}

    def define(self, s):
        acc_type = self.TYPES[s.dtype.name]
        init = None if s.init is None else self.literal(s.init, s.dtype)
        if s.size is not None and s.init is None:
            # a staging array (a packed operand, a cached row), used only through a restrict
            # pointer: GCC 12 otherwise assumed it might alias the register tile's accumulator
            # array and kept that in memory (a linear layer's transposed panel: 44 -> 80 GFLOP/s)
            self.emit(f"{acc_type} {s.name}_data[{s.size}] __attribute__((aligned(64)));")
            self.emit(f"{acc_type} *restrict {s.name} = __builtin_assume_aligned({s.name}_data, 64);")
        elif s.size is not None:
            # explicitly aligned: GCC 12 otherwise placed it misaligned under an aligned store
            self.emit(f"{acc_type} {s.name}[{s.size}] __attribute__((aligned(64)));")
            self.emit(f"for (int64_t q = 0; q < {s.size}; q++) {s.name}[q] = {init};")
        else:
            self.emit(f"{acc_type} {s.name} = {init};")
            if s.op == "max" and s.dtype.is_float:
                # a flag as wide as the value: GCC packs a uint8_t one from the compare's
                # lanes at every step (softmax 4096x1024: 2.29 -> 2.18 ms)
                self.emit(f"{'int32_t' if s.dtype.itemsize <= 4 else 'int64_t'} {s.name}_nan = 0;")

    def accumulate(self, define, index, op, v, dtype):
        if index is None and op == "max" and define.dtype.is_float:
            self.emit(f"{define.name}_nan |= ({v} != {v});")      # NaN wins, apart from the max
            return f"if ({v} > {define.name}) {define.name} = {v};"
        return op_form(COMBINE, op, dtype).format(self.read_accumulator(define.name, index), v)

    def fused(self, define, index, a, b, cond):
        target = f"{define.name}[{index}]"
        fma = f"{FMA[define.dtype]}({a}, {b}, {target})"
        return f"{target} = {fma if cond is None else f'{cond} ? {fma} : {target}'};"

    def write_accumulator(self, name, index, v):
        return f"{name}[{index}] = {v};"

    def write(self, param, index, v):
        return f"p{param}[{index}] = {v};"

    def combine_memory(self, param, index, op, v, dtype):
        return op_form(COMBINE, op, dtype).format(self.element(param, index), v)

    def widened_update(self, param, index, op, v, wide):
        stored = self.params[param].dtype
        return f"{{ float mg_sum = {self.convert(self.element(param, index), stored, wide)}; " \
               f"{op_form(COMBINE, op, wide).format('mg_sum', v)} " \
               f"{self.write(param, index, self.convert('mg_sum', wide, stored))} }}"

    def when(self, cond, update, check):
        return f"if ({cond}) {{ {update()} }}{f' else {{ *err = {check}; }}' if check else ''}"

    def loop(self, s, names):
        pragma, after = self.pragma(s)
        # register-blocked accumulations share their operands: one set of names for the body
        shared = {} if all(isinstance(b, ir.Accumulate) and b.index is not None for b in s.body) else None
        before = self.lines = []
        if s.kind == ir.VECTOR and shared is not None:
            for load in _invariant_loads(s):
                self.value(load, shared)
            branches = self.branches(s, shared)
            if branches is not None:
                return {"kind": "group", "lines": before, "body": branches}
        return {"kind": "loop", "var": s.var, "extent": s.extent, "pragma": pragma, "after": after,
                "before": before, "body": [self.statement(b, shared) for b in s.body]}

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
                inner = {"kind": "if", "cond": self.condition(cond), "body": [inner]}
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
                clauses.append(f"reduction({op_form(REDUCTION, acc.op, acc.dtype)}:{name})")
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


class CRenderer(Renderer):
    """The c backend's own spelling: float16 held as its bits, as bfloat16 is, and converted by
    c_helpers.j2's integer helpers (bang's and opencl's renderers derive from Renderer, whose
    float16 is _Float16: bang's intrinsics select on `_Float16 *`, opencl's memory is `half`)."""
    TYPES = HOST_CTYPE

    def __init__(self, kernel):
        super().__init__(kernel)
        # a float16 rounded from a float32 (its rendering) -> the float32. Read back as float32
        # (each op on float16 is rounded so: compiler/decompose.py) it is mg_round_f16 of that,
        # not a narrowing and a widening (a*b + sigmoid(a) over 1M: 7.4 -> 4.5 ms)
        self.narrowed_from = {}

    def literal(self, value, dtype):
        return bits_literal(value, dtype) if dtype == dtypes.float16 else super().literal(value, dtype)

    def bind(self, text, value):
        """No temporary for a narrowing: most are only read back as float32 (mg_round_f16), and
        GCC computes a repeated one once."""
        return text if text in self.narrowed_from else super().bind(text, value)

    def convert(self, x, source, target):
        """C's conversion of `x`, float16 through float32 as bfloat16's is; float64 to float16
        directly (rounded once, as numpy rounds it: through float32 could round twice)."""
        if source is target or dtypes.float16 not in (source, target):
            return super().convert(x, source, target)
        if source == dtypes.float16:
            if x in self.narrowed_from:
                return super().convert(f"mg_round_f16({self.narrowed_from[x]})", dtypes.float32, target)
            return super().convert(f"mg_f16_to_f32({x})", dtypes.float32, target)
        if source == dtypes.float64:
            return f"mg_f64_to_f16({x})"
        wide = super().convert(x, source, dtypes.float32)
        self.narrowed_from[f"mg_f32_to_f16({wide})"] = wide
        return f"mg_f32_to_f16({wide})"


_TEMPLATE = template("c.j2")


def render(kernels, vector_math=True):
    """C source for a batch of kernels (vector_math: declare libmvec's SIMD math functions)."""
    views = []
    for kernel in kernels:
        renderer = CRenderer(kernel)
        params = [{"ctype": HOST_CTYPE[p.dtype.name], "output": p.output, "shared": p.shared}
                  for p in kernel.params]
        views.append({"name": kernel.name, "params": params,
                      "body": [renderer.statement(s) for s in kernel.body]})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], vector_math=vector_math)


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
