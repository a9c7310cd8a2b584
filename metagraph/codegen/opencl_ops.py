"""The opencl backend's tables: the C family's (codegen/clike.py), with the forms OpenCL C needs in
their place. The C type names are defined in OpenCL C by templates/opencl.j2, and so are the mg_
helpers (the C backend's, templates/c_helpers.j2, and mg_round_half)."""
from metagraph.codegen import clike

# {unsigned}: the result's unsigned twin. int32 and int64 wrap, as numpy's do (signed overflow is
# undefined in OpenCL C, as in C, and no flag here makes it wrap)
UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t"}
WRAPPING = {"neg": "(({type})(({unsigned})0 - ({unsigned}){0}))",
            "add": "(({type})(({unsigned}){0} + ({unsigned}){1}))",
            "mul": "(({type})(({unsigned}){0} * ({unsigned}){1}))"}
OPS = {**clike.OPS, **{(op, name): form for op, form in WRAPPING.items() for name in UNSIGNED}}
# float16 values are floats (vload_half reads them), rounded to float16 by mg_round_half: from
# float64 directly, rounded once
WIDEN = {**clike.Renderer.WIDEN, "float16": "{0}"}
NARROW = {**clike.Renderer.NARROW, "float16": "mg_round_half({0})",
          ("float16", "float64"): "mg_round_half({0})"}
