"""The llvm backend's tables: each table op, index op and accumulation as LLVM instructions, and
its literals. float16 and bfloat16 math arrives as float32 (compiler/decompose.py); bfloat16 is
held as its bits (i16), converted by llvm.j2's helpers.
"""
import struct

import numpy as np

from metagraph import dtypes

LTYPE = {"bool": "i8", "uint8": "i8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
         "float16": "half", "bfloat16": "i16", "float32": "float", "float64": "double"}
FLOAT_SUFFIX = {"float16": "f16", "float32": "f32", "float64": "f64"}
COMPARE = {"cmplt": {"signed": "icmp slt", "unsigned": "icmp ult", "bool": "icmp ult", "float": "fcmp olt"},
           "cmpne": {"signed": "icmp ne", "unsigned": "icmp ne", "bool": "icmp ne", "float": "fcmp une"}}
GREATER = {"signed": "icmp sgt", "unsigned": "icmp ugt", "bool": "icmp ugt"}
# the op table: meta-op (or (op, operand dtype or kind)) -> instructions, `;`-separated ({r0}: the
# first one's result); {t} the operands' type, {rt} the result's, {s} the float suffix, {one} 1
OPS = {
    "neg": "sub {t} 0, {0}", ("neg", "float"): "fneg {t} {0}", "recip": "fdiv {t} {one}, {0}",
    **{op: f"call {{t}} @llvm.{op}.{{s}}({{t}} {{0}})" for op in ("sqrt", "exp2", "log2", "sin", "cos")},
    "pow": "call {t} @llvm.pow.{s}({t} {0}, {t} {1})",
    ("exp2", "float32"): "call float @mg_exp2f(float {0})",     # llvm.j2's, inline: see docs/architecture.md
    "add": "add {t} {0}, {1}", ("add", "float"): "fadd {t} {0}, {1}", ("add", "bool"): "or {t} {0}, {1}",
    "mul": "mul {t} {0}, {1}", ("mul", "float"): "fmul {t} {0}, {1}", ("mul", "bool"): "and {t} {0}, {1}",
    "and": "and {t} {0}, {1}", "or": "or {t} {0}, {1}", "xor": "xor {t} {0}, {1}",
    **{(op, kind): f"{test} {{t}} {{0}}, {{1}}; zext i1 {{r0}} to i8"
       for op, tests in COMPARE.items() for kind, test in tests.items()},
    **{("max", kind): f"{test} {{t}} {{0}}, {{1}}; select i1 {{r0}}, {{t}} {{0}}, {{t}} {{1}}"
       for kind, test in GREATER.items()},
    ("max", "float"): "fcmp ogt {t} {0}, {1}; fcmp uno {t} {0}, {0}; or i1 {r1}, {r0}; "      # NaN wins
                      "select i1 {r2}, {t} {0}, {t} {1}",
    "where": "icmp ne i8 {0}, 0; select i1 {r0}, {rt} {1}, {rt} {2}",
    "fma": "call {t} @llvm.fma.{s}({t} {0}, {t} {1}, {t} {2})",     # walker.accumulation's: rounded once
    # integer division, in int64 (walker.apply) by llvm.j2's helpers: a zero divisor reports the op's site
    "idiv": "call i64 @mg_idiv(i64 {0}, i64 {1}, ptr %err, i64 {site})",
    "mod": "call i64 @mg_imod(i64 {0}, i64 {1}, ptr %err, i64 {site})",
}
# an accumulator's update; accumulating may reorder (what `omp simd reduction` allows the C
# backend), and llvm.maximum keeps NaN: these vectorise as reductions
COMBINE = {"add": "add {t} {0}, {1}", ("add", "float"): "fadd reassoc {t} {0}, {1}",
           ("add", "bool"): "or {t} {0}, {1}", "mul": "mul {t} {0}, {1}",
           ("mul", "float"): "fmul reassoc {t} {0}, {1}", ("mul", "bool"): "and {t} {0}, {1}",
           "max": "call {t} @llvm.smax.{t}({t} {0}, {t} {1})",
           ("max", "unsigned"): "call {t} @llvm.umax.{t}({t} {0}, {t} {1})",
           ("max", "bool"): "call {t} @llvm.umax.{t}({t} {0}, {t} {1})",
           ("max", "float"): "call {t} @llvm.maximum.{s}({t} {0}, {t} {1})"}
# index ops: int64 arithmetic and i1 truth values; divisions by the walker's choice of form
INDEX = {"+": "add i64 {0}, {1}", "-": "sub i64 {0}, {1}", "*": "mul i64 {0}, {1}",
         "<": "icmp slt i64 {0}, {1}", "<=": "icmp sle i64 {0}, {1}", "==": "icmp eq i64 {0}, {1}",
         "!=": "icmp ne i64 {0}, {1}", "&&": "and i1 {0}, {1}", "||": "or i1 {0}, {1}",
         "min": "icmp slt i64 {0}, {1}; select i1 {r0}, i64 {0}, i64 {1}",
         "max": "icmp sgt i64 {0}, {1}; select i1 {r0}, i64 {0}, i64 {1}",
         ("//", "exact"): "sdiv i64 {0}, {1}", ("%", "exact"): "srem i64 {0}, {1}",
         ("//", "floor"): "call i64 @mg_floordiv(i64 {0}, i64 {1})",
         ("%", "floor"): "call i64 @mg_floormod(i64 {0}, i64 {1})",
         ("//", "checked"): "call i64 @mg_index_div(i64 {0}, i64 {1}, ptr %err)",
         ("%", "checked"): "call i64 @mg_index_mod(i64 {0}, i64 {1}, ptr %err)",
         "widen": "zext i1 {0} to i64", "truth": "icmp ne i64 {0}, 0"}     # i1 <-> i64
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


# conversions (walker.conversion's kinds, by the source's dtype kind): {t} the source's type, {rt} the
# target's; integers of one width are the same value (None)
CAST = {"nonzero": "icmp ne {t} {0}, 0; zext i1 {r0} to i8",
        ("nonzero", "float"): "fcmp une {t} {0}, 0.0; zext i1 {r0} to i8",
        "extend": "zext {t} {0} to {rt}", ("extend", "signed"): "sext {t} {0} to {rt}",
        ("extend", "float"): "fpext {t} {0} to {rt}", "narrow": "trunc {t} {0} to {rt}",
        ("narrow", "float"): "fptrunc {t} {0} to {rt}", "same": None,
        "to float": "uitofp {t} {0} to {rt}", ("to float", "signed"): "sitofp {t} {0} to {rt}",
        "to integer": "fptosi {t} {0} to {rt}",
        "to narrow integer": "fptosi {t} {0} to i32; trunc i32 {r0} to {rt}"}
# storage types: bfloat16 is its bits (i16), converted through float32 by llvm.j2's helpers
WIDEN = {"bfloat16": "call float @mg_bf16_to_f32(i16 {0})"}
NARROW = {"bfloat16": "call i16 @mg_f32_to_bf16(float {0})"}
