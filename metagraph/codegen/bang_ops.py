"""The bang backend's op table: each table op as one BANG vector intrinsic over a tile of NRAM lanes
(`templates/bang_host.h` defines them with the oracle's semantics), looked up by walker.op_form as
the other backends' tables are; scalar math is the C family's table (codegen/clike.py).
"""
from metagraph import dtypes
from metagraph.codegen import clike
from metagraph.codegen.walker import op_form
from metagraph.compiler import ir

NAME = {"bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
        "int64": "int64", "float16": "half", "bfloat16": "bfloat16", "float32": "float", "float64": "double"}
# meta-op (or (op, operand dtype or kind)) -> the intrinsic computing it on buffers:
# intrinsic(out, operands..., lanes); integer division adds the error word and the op's site
VECTOR = {"add": "__bang_add", "mul": "__bang_mul", "max": "__bang_maxequal", "and": "__bang_band",
          "or": "__bang_bor", "xor": "__bang_bxor", "cmplt": "__bang_lt", "cmpne": "__bang_ne",
          "pow": "__bang_pow", "where": "__bang_select", "idiv": "__bang_floordiv", "mod": "__bang_floormod",
          ("add", "bool"): "__bang_bor", ("mul", "bool"): "__bang_band", ("max", "bool"): "__bang_bor",
          "neg": "__bang_neg", "recip": "__bang_active_recip", "sqrt": "__bang_active_sqrt",
          "exp2": "__bang_active_exp2", "log2": "__bang_active_log2", "sin": "__bang_active_sin",
          "cos": "__bang_active_cos", "relu": "__bang_active_relu"}
# a buffer and a scalar operand (not for bool)
WITH_SCALAR = {"add": "__bang_add_scalar", "mul": "__bang_mul_scalar", "max": "__bang_maxequal_scalar"}
REDUCE = {"add": "__bang_reduce_sum", "mul": "__bang_reduce_mul", "max": "__bang_reduce_max",
          ("add", "bool"): "__bang_reduce_or", ("mul", "bool"): "__bang_reduce_and",
          ("max", "bool"): "__bang_reduce_or"}
SCATTER = {"add": "__scatter_add", "max": "__scatter_max", ("add", "bool"): "__scatter_bor",
           ("max", "bool"): "__scatter_bor"}
TABLES = {"reduce": REDUCE, "update": VECTOR, "scatter_update": SCATTER}     # the other steps with an op


def fused(value):
    """("relu", (x,)) for where(0 < x or x != x, x, 0), relu as math.relu composes it (NaN stays
    NaN; for integers where(0 < x, x, 0)): one intrinsic; else None."""
    if not isinstance(value, ir.Apply) or value.op != "where":
        return None
    test, x, zero = value.args
    if not (isinstance(zero, ir.Scalar) and zero.value == 0 and x.dtype != dtypes.bool_):
        return None
    if x.dtype.is_float:
        if not (isinstance(test, ir.Apply) and test.op == "or"):
            return None
        test, nan = test.args
        if not (isinstance(nan, ir.Apply) and nan.op == "cmpne" and nan.args[0] is x and nan.args[1] is x):
            return None
    relu = isinstance(test, ir.Apply) and test.op == "cmplt" and test.args[1] is x and \
        isinstance(test.args[0], ir.Scalar) and test.args[0].value == 0
    return ("relu", (x,)) if relu else None


def intrinsic(step):
    """The function a tile step with an op calls (compute: by its operands' dtype and the result's
    buffer; a scalar second operand takes the `_scalar` form)."""
    op, dtype = step.operands["op"], step.operands["dtype"]
    if step.kind != "compute":
        return op_form(TABLES[step.kind], op, dtype)
    if op == "cast":
        return f"__bang_{NAME[dtype.name]}2{NAME[step.operands['out'].dtype.name]}"
    return WITH_SCALAR[op] if step.operands["scalar"] else op_form(VECTOR, op, dtype)


def combine(step):
    """The C statement template ({0} op= {1}) of a step that updates scalars or lanes one by one."""
    return op_form(clike.COMBINE, step.operands["op"], step.operands["dtype"])
