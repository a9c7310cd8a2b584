"""The opencl backend's op table: each meta-op's OpenCL C expression (codegen/opencl.py renders
the rest). Operands are the C renderer's temporaries, so a form may name one twice; the C type
names are defined in OpenCL C by templates/opencl.j2, and so are the mg_ helpers (the C backend's,
templates/c_helpers.j2, and mg_round_half)."""
from metagraph import dtypes
from metagraph.codegen.c import CTYPE

# meta-op -> OpenCL C: {0} {1} {2} the operands, {type} the result's C type, {unsigned} its
# unsigned twin, {site} the op's error site (integer division by zero)
OPS = {
    "neg": "(-{0})", "recip": "(({type})1 / {0})",
    "sqrt": "sqrt({0})", "exp2": "exp2({0})", "log2": "log2({0})", "sin": "sin({0})", "cos": "cos({0})",
    "pow": "pow({0}, {1})",
    "add": "({0} + {1})", "mul": "({0} * {1})", "max": "(({0} > {1}) ? {0} : {1})",
    "cmplt": "({0} < {1})", "cmpne": "({0} != {1})", "where": "({0} ? {1} : {2})",
    "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
    "idiv": "(({type})mg_idiv({0}, {1}, err, {site}))", "mod": "(({type})mg_imod({0}, {1}, err, {site}))",
}
# (op, kind or dtype of its operands) where they need another form
VARIANTS = {
    # the C helpers' float32 exp2 (0.92 ulp), inline: PoCL's own is a call per element
    ("exp2", "float32"): "mg_exp2f({0})",
    ("max", "float"): "(({0} != {0} || {0} > {1}) ? {0} : {1})",     # NaN wins
    ("add", "bool"): "({0} | {1})", ("mul", "bool"): "({0} & {1})",
    # int32 and int64 wrap, as numpy's do (signed overflow is undefined in OpenCL C, as in C)
    ("neg", "wrapping"): "(({type})(({unsigned})0 - ({unsigned}){0}))",
    ("add", "wrapping"): "(({type})(({unsigned}){0} + ({unsigned}){1}))",
    ("mul", "wrapping"): "(({type})(({unsigned}){0} * ({unsigned}){1}))",
}
UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t"}


def _kind(dtype):
    """Which VARIANTS an operand of `dtype` takes."""
    if dtype == dtypes.bool_:
        return "bool"
    if dtype.name in UNSIGNED:
        return "wrapping"
    return "float" if dtype.is_float else "integer"


def cast(x, source, dtype):
    """OpenCL C converting `x` from `source` to `dtype` (float16 values are floats; bfloat16's are
    their bits, converted through float32 as the C backend's)."""
    if dtype == dtypes.bool_:
        return f"({x} != 0)"
    if source == dtypes.bfloat16:
        x = f"mg_bf16_to_f32({x})"
    if dtype == dtypes.bfloat16:
        return f"mg_f32_to_bf16((float){x})"
    if dtype == dtypes.float16:     # an integer's exact below 2^24, and inf in float16 above
        return f"mg_round_half({x})"
    return f"(({CTYPE[dtype.name]}){x})"


def expression(value, args):
    """OpenCL C for an ir.Apply `value` on its operands' C expressions `args`."""
    source = value.args[0].dtype if value.args else value.dtype
    if value.op == "cast":
        return cast(args[0], source, value.dtype)
    form = VARIANTS.get((value.op, source.name)) or VARIANTS.get((value.op, _kind(source))) or OPS[value.op]
    return form.format(*args, type=CTYPE[value.dtype.name], unsigned=UNSIGNED.get(value.dtype.name),
                       site=value.site)
