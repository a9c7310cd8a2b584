"""Ops a backend does not render, written with rows it does: exact rewrites of kernel-IR values.

A code generator declares the table rows it renders (`CompiledBackend.renders`); lowering asks
here for the others. Each rule is exact (same bits, same NaN and overflow behaviour, same error
on a zero divisor), so a backend that leaves one out still matches the oracle. Rows with no exact
composition from the others (sqrt, exp2, log2, sin, cos, pow, recip, cmplt, cmpne, where, cast,
and, or, xor, idiv) have no rule: a backend must render them.
"""
from metagraph import dtypes
from metagraph.compiler import ir
from metagraph.errors import MetagraphError


def _neg(x, dtype, site):
    return ir.Apply("mul", (x, ir.Scalar(-1, dtype)), dtype)


def _max(a, b, dtype, site):
    """a where b < a or a is NaN, else b: the table's max (NaN wins, the second operand on ties)."""
    greater = ir.Apply("cmplt", (b, a), dtypes.bool_)
    if dtype.is_float:
        greater = ir.Apply("or", (greater, ir.Apply("cmpne", (a, a), dtypes.bool_)), dtypes.bool_)
    return ir.Apply("where", (greater, a, b), dtype)


def _mod(a, b, dtype, site):
    """a - floor(a / b) * b, with the division's zero-divisor error."""
    product = ir.Apply("mul", (ir.Apply("idiv", (a, b), dtype, site), b), dtype)
    return ir.Apply("add", (a, ir.Apply("mul", (product, ir.Scalar(-1, dtype)), dtype)), dtype)


RULES = {"neg": _neg, "max": _max, "mod": _mod}


def apply(op, args, dtype, site, renders):
    """The IR value of table op `op` on `args`, decomposed when the backend does not render it."""
    if renders is None or op in renders:
        return ir.Apply(op, args, dtype, site)
    if op not in RULES:
        raise MetagraphError(f"the backend does not render the table op {op!r}, and {op!r} has no exact "
                             f"decomposition into other rows; a backend must render it")
    return _check(RULES[op](*args, dtype, site), renders)


def _check(value, renders):
    """Every op a rule uses must be one the backend renders (rules use no decomposable op)."""
    if isinstance(value, ir.Apply):
        if value.op not in renders:
            raise MetagraphError(f"decomposing for this backend needs the table op {value.op!r}, "
                                 f"which it does not render")
        for arg in value.args:
            _check(arg, renders)
    return value
