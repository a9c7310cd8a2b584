"""The opencl backend's op table: the C backend's (codegen/c.py: OPS), with the forms OpenCL C needs
in its place. The C type names are defined in OpenCL C by templates/opencl.j2, and so are the mg_
helpers (the C backend's, templates/c_helpers.j2, and mg_round_half)."""
from metagraph import dtypes
from metagraph.codegen import c

# {unsigned}: the result's unsigned twin. int32 and int64 wrap, as numpy's do (signed overflow is
# undefined in OpenCL C, as in C, and no flag here makes it wrap)
UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t"}
WRAPPING = {"neg": "(({type})(({unsigned})0 - ({unsigned}){0}))",
            "add": "(({type})(({unsigned}){0} + ({unsigned}){1}))",
            "mul": "(({type})(({unsigned}){0} * ({unsigned}){1}))"}
OPS = {**c.OPS, **{(op, name): form for op, form in WRAPPING.items() for name in UNSIGNED}}


def cast(x, source, target, c_cast):
    """OpenCL C converting `x` from `source` to `target`: float16 values are floats (read by
    vload_half), rounded to float16 by mg_round_half; the rest as C's `c_cast` converts."""
    if target == dtypes.float16 and source is not target:     # an integer's exact below 2^24
        return f"mg_round_half({x})"
    return x if (source, target) == (dtypes.float16, dtypes.float32) else c_cast(x, source, target)
