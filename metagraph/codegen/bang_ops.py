"""The bang backend's per-op table: each table op as one BANG vector intrinsic over a tile of
NRAM lanes (`templates/bang_host.h` defines them with the oracle's semantics). `VectorOps` is
mixed into the renderer, which provides `emit`, `buffer`, `lanes` and `spread`.
"""
from metagraph import dtypes
from metagraph.compiler import ir

NAME = {"bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
        "int64": "int64", "float16": "half", "bfloat16": "bfloat16", "float32": "float", "float64": "double"}
# the per-op table of vector intrinsics (operands and result are NRAM buffers of TILE lanes)
VECTOR = {"add": "__bang_add", "mul": "__bang_mul", "max": "__bang_maxequal", "and": "__bang_band",
          "or": "__bang_bor", "xor": "__bang_bxor", "cmplt": "__bang_lt", "cmpne": "__bang_ne",
          "pow": "__bang_pow"}
BOOL_VECTOR = {"add": "__bang_bor", "mul": "__bang_band", "max": "__bang_bor"}
WITH_SCALAR = {"add": "__bang_add_scalar", "mul": "__bang_mul_scalar", "max": "__bang_maxequal_scalar"}
UNARY = {"neg": "__bang_neg", "recip": "__bang_active_recip", "sqrt": "__bang_active_sqrt",
         "exp2": "__bang_active_exp2", "log2": "__bang_active_log2", "sin": "__bang_active_sin",
         "cos": "__bang_active_cos"}
DIVIDE = {"idiv": "__bang_floordiv", "mod": "__bang_floormod"}
REDUCE = {"add": "__bang_reduce_sum", "mul": "__bang_reduce_mul", "max": "__bang_reduce_max"}
BOOL_REDUCE = {"add": "__bang_reduce_or", "mul": "__bang_reduce_and", "max": "__bang_reduce_or"}
SCATTER = {"add": "__scatter_add", "max": "__scatter_max"}


def _is_relu(value):
    """where(0 < x or x != x, x, 0): relu as math.relu composes it (NaN stays NaN); for integers
    where(0 < x, x, 0)."""
    test, x, zero = value.args
    if not (isinstance(zero, ir.Scalar) and zero.value == 0 and x.dtype != dtypes.bool_):
        return False
    if x.dtype.is_float:
        if not (isinstance(test, ir.Apply) and test.op == "or"):
            return False
        test, nan = test.args
        if not (isinstance(nan, ir.Apply) and nan.op == "cmpne" and nan.args[0] is x and nan.args[1] is x):
            return False
    return isinstance(test, ir.Apply) and test.op == "cmplt" and test.args[1] is x and \
        isinstance(test.args[0], ir.Scalar) and test.args[0].value == 0


class VectorOps:
    """Values of table ops over a tile, as intrinsic calls."""

    def compute(self, value, out, names):
        op, dtype = value.op, value.dtype
        source = value.args[0].dtype
        if op == "where" and _is_relu(value):
            x = self.spread(self.lanes(value.args[1], names), dtype)
            self.emit(f"__bang_active_relu({out}, {x}, lanes);")
            return
        operands = [self.lanes(arg, names) for arg in value.args]
        if op == "cast":
            x = self.spread(operands[0], source)
            self.emit(f"__bang_{NAME[source.name]}2{NAME[dtype.name]}({out}, {x}, lanes);")
        elif op in UNARY:
            self.emit(f"{UNARY[op]}({out}, {operands[0][0]}, lanes);")
        elif op == "where":
            c_, a, b = (self.spread(o, arg.dtype) for o, arg in zip(operands, value.args))
            self.emit(f"__bang_select({out}, {c_}, {a}, {b}, lanes);")
        elif op in DIVIDE:
            a, b = (self.spread(o, source) for o in operands)
            self.emit(f"{DIVIDE[op]}({out}, {a}, {b}, lanes, err, {value.site});")
        else:
            (a, a_is_buffer), (b, b_is_buffer) = operands
            if source != dtypes.bool_ and op in WITH_SCALAR and not (a_is_buffer and b_is_buffer):
                vector, scalar = (a, b) if a_is_buffer else (b, a)
                self.emit(f"{WITH_SCALAR[op]}({out}, {vector}, {scalar}, lanes);")
                return
            table = BOOL_VECTOR if source == dtypes.bool_ and op in BOOL_VECTOR else VECTOR
            a, b = self.spread(operands[0], source), self.spread(operands[1], source)
            self.emit(f"{table[op]}({out}, {a}, {b}, lanes);")

    def converted(self, buffer, source, target):
        if source is target:
            return buffer
        out = self.buffer(target)
        self.emit(f"__bang_{NAME[source.name]}2{NAME[target.name]}({out}, {buffer}, lanes);")
        return out
