"""C-like text: the walker's constructs spelt as C, as the c, opencl and bang backends render them.

What those three share is here: the op table of C expressions (OPS, INDEX, COMBINE), C's literals,
and `Renderer`, which spells values as C expressions (each computed value a temporary), statements
as lines, and loops as the structures that `templates/clike.j2`'s `block` macro writes (loops,
branches, groups of lines). A backend subclasses Renderer for what is its own: the c backend its
OpenMP pragmas and float16 held as bits (codegen/c.py), opencl its float16 memory and work-items
(codegen/opencl.py), bang its tile programs (codegen/bang.py).
"""
import math

import numpy as np

from metagraph import dtypes
from metagraph.codegen.compiled import fused_product
from metagraph.codegen.walker import Walker, op_form, pure
from metagraph.compiler import ir
from metagraph.expr import Var, linear_terms, variables

CTYPE = {"bool": "uint8_t", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
         "int64": "int64_t", "float16": "_Float16", "bfloat16": "uint16_t", "float32": "float",
         "float64": "double"}   # bfloat16 is its bits: C has no arithmetic type for it (GCC 12)

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
    "idiv": "mg_idiv({0}, {1}, err, {site})", "mod": "mg_imod({0}, {1}, err, {site})",    # int64 (walker)
    # a * b + c rounded once: walker.accumulation's fused multiply-add
    ("fma", "float32"): "fmaf({0}, {1}, {2})", ("fma", "float64"): "fma({0}, {1}, {2})",
}
# index ops (int64); divisions by the walker's choice of form (walker.division)
INDEX = {op: f"({{0}} {op} {{1}})" for op in ("+", "-", "*", "<", "<=", "==", "!=", "&&", "||")}
# two truth values (0 or 1) of which the second reads nothing and cannot fail: both evaluated, no
# branch (GCC 12 made `a && b` control flow, the loads after it masked loads, and a strided masked
# load kept the loop scalar: a 3x3/2 max pooling's tap search, 1.1 -> 0.63 ms)
INDEX.update({("&&", "pure"): "({0} & {1})", ("||", "pure"): "({0} | {1})"})
INDEX.update({"min": "(({0}) < ({1}) ? ({0}) : ({1}))", "max": "(({0}) > ({1}) ? ({0}) : ({1}))",
              ("//", "exact"): "({0} / {1})", ("%", "exact"): "({0} % {1})",
              ("//", "floor"): "mg_floordiv({0}, {1})", ("%", "floor"): "mg_floormod({0}, {1})",
              ("//", "checked"): "mg_index_div({0}, {1}, err)",
              ("%", "checked"): "mg_index_mod({0}, {1}, err)"})
# conversions (walker.conversion's kinds): C's cast, to bool a test
CASTS = ("extend", "narrow", "same", "to float", "to integer", "to narrow integer")
CAST = {"nonzero": "({0} != 0)", **{kind: "(({type}){0})" for kind in CASTS}}
# an accumulation's update (a statement). A max stores what it selects, never under an `if`: GCC 12
# vectorises a select but not a conditional store to an array element (a register tile's row of a
# max pooling: 1.0 ms as an `if`, 0.19 as a select)
COMBINE = {"add": "{0} += {1};", "mul": "{0} *= {1};", "max": "{0} = {1} > {0} ? {1} : {0};",
           ("add", "bool"): "{0} |= {1};", ("mul", "bool"): "{0} &= {1};",
           ("max", "float"): "{0} = {1} != {1} || {1} > {0} ? {1} : {0};"}


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
    """The walker's constructs spelt as C: values are temporaries, each statement a list of lines,
    loops the template's structures. Types are TYPES' (float16 as _Float16; bfloat16 as its bits,
    converted through float32 by c_helpers.j2's helpers)."""
    OPS, INDEX, CAST, TYPES = OPS, INDEX, CAST, CTYPE
    WIDEN = {"bfloat16": "mg_bf16_to_f32({0})"}
    NARROW = {"bfloat16": "mg_f32_to_bf16({0})"}

    def __init__(self, kernel):
        super().__init__(kernel)
        self.temporaries = 0        # numbered per kernel: two statements may share a scope
        self.vector_var = None      # the variable of the vector loop being rendered, if any

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

    def load(self, value):
        """A load under a condition that varies along the vector loop, reading with a stride
        along it, reads unconditionally at its index clamped into the buffer, and then masks the
        value: GCC 12 has no masked strided load and leaves such a loop scalar (a padded stride-2
        conv's input copy in MobileNetV2: 6.5 -> 1.6 ms a call, one thread). The clamp is
        statements of its own: written inside the address, GCC makes it a masked load again.
        Only where that is harmless: the index computes without reading index tensors or
        dividing, and the buffer is not empty."""
        var = self.vector_var
        if var is None or value.valid is None or var not in variables(value.valid) or \
                _stride(value.index, var) in (0, 1) or not pure(value.index) or \
                not math.prod(self.params[value.param].shape):
            return super().load(value)
        last = math.prod(self.params[value.param].shape) - 1
        clamped = f"t{self.temporaries}"
        self.temporaries += 1
        self.emit(f"int64_t {clamped} = {self.index(value.index)};")
        self.emit(f"{clamped} = {clamped} > 0 ? {clamped} : 0;")
        self.emit(f"{clamped} = {clamped} < {self.integer(last)} ? {clamped} : {self.integer(last)};")
        read = self.bind(self.convert(self.element(value.param, clamped), self.params[value.param].dtype,
                                      value.dtype), value)
        return self.choose(self.condition(value.valid), lambda: read, lambda: self.zero(value.dtype),
                           value.dtype, lazy=False)

    def implies(self, valid, cond):
        return f"(!{valid} || {cond()})"

    def guarded(self, cond, inner, fill, check, dtype):
        return f"({cond} ? {inner} : {f'(mg_fail(err, {check}), {fill})' if check else fill})"

    def element(self, param, index):
        return f"p{param}[{index}]"

    def read_accumulator(self, name, index):
        return name if index is None else f"{name}[{index}]"

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

    def write_accumulator(self, name, index, v):
        return f"{self.read_accumulator(name, index)} = {v};"

    def write(self, param, index, v):
        return f"p{param}[{index}] = {v};"

    def combine_memory(self, param, index, op, v, dtype):
        return op_form(COMBINE, op, dtype).format(self.element(param, index), v)

    def combine(self, op, a, b, dtype):
        """The op's expression with b first: a max keeps b where b is NaN or greater, as COMBINE's."""
        return self.form(op_form(self.OPS, op, dtype), b, a, **self.fields(dtype, dtype))

    def when(self, cond, update, check):
        return f"if ({cond}) {{ {update()} }}{f' else {{ *err = {check}; }}' if check else ''}"

    # ---- loops ---------------------------------------------------------------------------------
    def loop(self, s, names):
        # register-blocked accumulations share their operands: one set of names for the body
        shared = {} if all(isinstance(b, ir.Accumulate) and b.index is not None for b in s.body) else None
        before = self.lines = []
        if s.kind == ir.VECTOR and shared is not None:
            for load in _invariant_loads(s):
                self.value(load, shared)
            branches = self.branches(s, shared)
            if branches is not None:
                return {"kind": "group", "lines": before, "body": branches}
        outside, self.vector_var = self.vector_var, s.var if s.kind == ir.VECTOR else self.vector_var
        body = [self.statement(b, shared) for b in s.body]
        self.vector_var = outside
        # (a RuntimeExtent, compiler/generic.py, writes itself as its expression of the argument)
        return {"kind": "loop", "var": s.var, "extent": s.extent, "pragma": self.pragma(s),
                "after": self.finish(s), "before": before, "body": body}

    def pragma(self, loop):
        """The loop's pragma (the c backend's OpenMP ones; none here)."""
        return None

    def reduced(self, loop):
        """The scalar accumulators a reduction loop accumulates (jammed dot products have several)."""
        if loop.kind != ir.REDUCE:
            return []
        names = (s.name for s in loop.body if isinstance(s, ir.Accumulate) and s.index is None)
        return list(dict.fromkeys(names))

    def finish(self, loop):
        """The lines after a reduction loop: a float max whose NaN flag it raised is NaN."""
        return [f"if ({name}_nan) {name} = NAN;" for name in self.reduced(loop)
                if self.accumulators[name].op == "max" and self.accumulators[name].dtype.is_float]

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
            inner = {"kind": "loop", "var": loop.var, "extent": loop.extent, "pragma": self.pragma(loop),
                     "after": [], "before": [], "body": [self.statement(unmasked, dict(shared))]}
            if cond is not None:
                inner = {"kind": "if", "cond": self.condition(cond), "body": [inner]}
            branches.append(inner)
        return branches


def _invariant_loads(loop):
    """The unconditional loads in a vector loop's body that do not vary along it. They are read
    before the loop: GCC 12 otherwise sinks a weight read into a masked multiply-add's branch and
    then cannot vectorise the masked load of one address (a guarded conv input gradient ran
    scalar, 11 GFLOP/s; 34 with its weights read first)."""
    found = {id(load): load for statement in loop.body for load in ir.loads(statement.value)
             if load.valid is None and loop.var not in variables(load.index)}
    return list(found.values())


def _stride(index, var):
    """Elements an index moves per step of `var`, or None where it is not linear in it."""
    terms, _ = linear_terms(index)
    if any(term != Var(var) and var in variables(term) for term in terms):
        return None
    return terms.get(Var(var), 0)
