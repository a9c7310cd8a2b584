"""The LLVM backend's per-op table: each table op as LLVM instructions and intrinsics, with the
semantics the numpy oracle defines (NaN wins in max, floor division, wrapping integers, C's
conversions). float16 and bfloat16 math arrives as float32 (compiler/decompose.py); bfloat16 is
held as its bits (i16), converted here by shifts and rounding on the bits, as c_helpers.j2 does.
`Ops` is mixed into the renderer, which provides `instruction` (emit one, return its name) and
`call`.
"""
import struct

import numpy as np

from metagraph import dtypes

LTYPE = {"bool": "i8", "uint8": "i8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
         "float16": "half", "bfloat16": "i16", "float32": "float", "float64": "double"}
# the per-op table: (op, kind) -> instruction; kind is f (float), i (signed), u (unsigned), b (bool)
BINARY = {("add", "f"): "fadd", ("mul", "f"): "fmul",
          ("add", "i"): "add", ("mul", "i"): "mul", ("add", "u"): "add", ("mul", "u"): "mul",
          ("add", "b"): "or", ("mul", "b"): "and"}
BITWISE = {"and": "and", "or": "or", "xor": "xor"}
COMPARE = {("cmplt", "f"): "fcmp olt", ("cmplt", "i"): "icmp slt", ("cmplt", "u"): "icmp ult",
           ("cmplt", "b"): "icmp ult", ("cmpne", "f"): "fcmp une", ("cmpne", "i"): "icmp ne",
           ("cmpne", "u"): "icmp ne", ("cmpne", "b"): "icmp ne"}
GREATER = {"f": "fcmp ogt", "i": "icmp sgt", "u": "icmp ugt", "b": "icmp ugt"}
MATH = {"sqrt": "llvm.sqrt", "exp2": "llvm.exp2", "log2": "llvm.log2", "sin": "llvm.sin",
        "cos": "llvm.cos", "pow": "llvm.pow"}
FLOAT_SUFFIX = {"float16": "f16", "float32": "f32", "float64": "f64"}
# accumulating may reorder (what `omp simd reduction` allows the C backend): it lets loops vectorise
ACCUMULATE = {("add", "f"): "fadd reassoc", ("mul", "f"): "fmul reassoc"}


def kind(dtype):
    return "b" if dtype == dtypes.bool_ else dtype.kind


def constant(value, dtype):
    """An LLVM literal of `dtype` (floats as the hex of the double holding the rounded value)."""
    if dtype == dtypes.bfloat16:
        return str(int(np.array(value, dtype=dtype.np).view(np.int16)))
    if dtype.is_float:
        rounded = float(np.array(value, dtype=dtype.np))
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", rounded))[0]
    if dtype == dtypes.bool_:
        return "1" if value else "0"
    bits = dtype.itemsize * 8
    value = int(value) & ((1 << bits) - 1)
    return str(value - (1 << bits) if value >= 1 << (bits - 1) else value)


class Ops:
    """Values of table ops, as instructions."""

    def apply(self, value, args):
        """One table op: the per-op table, with the semantics the numpy oracle defines."""
        op, dtype = value.op, value.dtype
        source = value.args[0].dtype if value.args else dtype
        t, k = LTYPE[source.name], kind(source)
        if op == "cast":
            return self.convert(args[0], source, dtype)
        if op == "neg":
            return self.instruction(f"fneg {t} {args[0]}" if k == "f" else f"sub {t} 0, {args[0]}")
        if op == "recip":
            return self.instruction(f"fdiv {t} {constant(1, dtype)}, {args[0]}")
        if op in MATH:
            if (op, dtype) == ("exp2", dtypes.float32):
                return self.instruction(f"call float @mg_exp2f(float {args[0]})")
            return self.call(t, f"{MATH[op]}.{FLOAT_SUFFIX[dtype.name]}", [f"{t} {a}" for a in args])
        if op == "max":
            a, b = args
            greater = self.instruction(f"{GREATER[k]} {t} {a}, {b}")
            if k == "f":    # NaN wins
                nan = self.instruction(f"fcmp uno {t} {a}, {a}")
                greater = self.instruction(f"or i1 {nan}, {greater}")
            return self.instruction(f"select i1 {greater}, {t} {a}, {t} {b}")
        if op == "where":
            cond = self.instruction(f"icmp ne i8 {args[0]}, 0")
            t = LTYPE[dtype.name]
            return self.instruction(f"select i1 {cond}, {t} {args[1]}, {t} {args[2]}")
        if op in ("idiv", "mod"):
            a, b = (self.convert(arg, source, dtypes.int64) for arg in args)
            result = self.call("i64", "mg_idiv" if op == "idiv" else "mg_imod",
                               [f"i64 {a}", f"i64 {b}", "ptr %err", f"i64 {value.site}"])
            return self.convert(result, dtypes.int64, dtype, truncate_bool=True)
        if op in ("cmplt", "cmpne"):
            flag = self.instruction(f"{COMPARE[op, k]} {t} {args[0]}, {args[1]}")
            return self.instruction(f"zext i1 {flag} to i8")
        instruction = BITWISE.get(op) or BINARY[op, k]
        return self.instruction(f"{instruction} {t} {args[0]}, {args[1]}")

    def convert(self, x, source, target, truncate_bool=False):
        """C's conversion from `source` to `target` (to bool: != 0, unless truncating an index)."""
        if source is target:
            return x
        if source == dtypes.bfloat16:
            wide = self.instruction(f"shl i32 {self.instruction(f'zext i16 {x} to i32')}, 16")
            return self.convert(self.instruction(f"bitcast i32 {wide} to float"), dtypes.float32, target)
        if target == dtypes.bfloat16:
            return self.narrow_bf16(self.convert(x, source, dtypes.float32))
        s, t = LTYPE[source.name], LTYPE[target.name]
        if target == dtypes.bool_ and not truncate_bool:
            test = f"fcmp une {s} {x}, 0.0" if source.is_float else f"icmp ne {s} {x}, 0"
            return self.instruction(f"zext i1 {self.instruction(test)} to i8")
        if source.is_float and target.is_float:
            change = "fpext" if target.itemsize > source.itemsize else "fptrunc"
            return self.instruction(f"{change} {s} {x} to {t}")
        if source.is_float:      # x86's conversion: through int32 for the narrow types
            if target.itemsize < 4:
                wide = self.instruction(f"fptosi {s} {x} to i32")
                return self.instruction(f"trunc i32 {wide} to {t}")
            return self.instruction(f"fptosi {s} {x} to {t}")
        signed = source.kind == "i"
        if target.is_float:
            return self.instruction(f"{'sitofp' if signed else 'uitofp'} {s} {x} to {t}")
        if target.itemsize == source.itemsize:
            return x
        if target.itemsize > source.itemsize:
            return self.instruction(f"{'sext' if signed else 'zext'} {s} {x} to {t}")
        return self.instruction(f"trunc {s} {x} to {t}")

    def narrow_bf16(self, x):
        """A float32 rounded to bfloat16 bits: to nearest even, NaN as the quiet NaN 0x7fc0."""
        bits = self.instruction(f"bitcast float {x} to i32")
        odd = self.instruction(f"and i32 {self.instruction(f'lshr i32 {bits}, 16')}, 1")
        rounded = self.instruction(f"add i32 {self.instruction(f'add i32 {bits}, 32767')}, {odd}")
        narrow = self.instruction(f"trunc i32 {self.instruction(f'lshr i32 {rounded}, 16')} to i16")
        nan = self.instruction(f"fcmp uno float {x}, 0.0")
        return self.instruction(f"select i1 {nan}, i16 32704, i16 {narrow}")

    def combine(self, old, op, v, dtype):
        t, k = LTYPE[dtype.name], kind(dtype)
        if op == "max":     # llvm.maximum: NaN wins, and stays; these vectorise as reductions
            function = {"f": "llvm.maximum", "i": "llvm.smax"}.get(k, "llvm.umax")
            suffix = FLOAT_SUFFIX[dtype.name] if k == "f" else t
            return self.call(t, f"{function}.{suffix}", [f"{t} {old}", f"{t} {v}"])
        instruction = ACCUMULATE.get((op, k)) or BINARY[op, k]
        return self.instruction(f"{instruction} {t} {old}, {v}")
