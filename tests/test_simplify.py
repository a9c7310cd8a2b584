"""Index-expression simplification keeps every value over the loop variables' ranges."""
import itertools
import operator

from hypothesis import given, settings, strategies as st

from metagraph.compiler.simplify import simplify
from metagraph.expr import Binary, Const, Var

EXTENTS = {0: 7, 1: 5}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def _value(expr, point):
    if isinstance(expr, Var):
        return point[expr.axis]
    if isinstance(expr, Const):
        return expr.value
    a, b = _value(expr.a, point), _value(expr.b, point)
    return OPS[expr.op](a, b)


def _same_everywhere(before, after):
    for point in itertools.product(*(range(EXTENTS[v]) for v in sorted(EXTENTS))):
        assert _value(before, point) == _value(after, point), (before, after, point)


def test_a_split_read_back_whole_is_the_variable():
    v = Var(0)
    split = (v % 2) + (v // 2) * 2
    assert simplify(split, EXTENTS) == v
    assert simplify(Var(1) * 2 + split - 1, EXTENTS) == simplify(Var(1) * 2 + v - 1, EXTENTS)
    scaled = ((v + 3) % 4) * 3 + ((v + 3) // 4) * 12
    assert simplify(scaled, EXTENTS) == simplify(v * 3 + 9, EXTENTS)


def test_parts_that_do_not_recombine_stay():
    v = Var(0)
    for expr in ((v % 4) * 3 + (v // 4) * 8, (v % 4) + (Var(1) // 4) * 4, (v % 3) + (v // 3) * 2):
        after = simplify(expr, EXTENTS)
        assert "%" in str(after)
        _same_everywhere(expr, after)


_leaf = st.one_of(st.sampled_from([Var(0), Var(1)]), st.integers(-4, 4).map(Const))


def _combine(children):
    ops = st.sampled_from(["+", "-", "*"])
    divided = st.tuples(children, st.sampled_from(["//", "%"]), st.integers(1, 5).map(Const))
    return st.one_of(st.tuples(children, ops, children).map(lambda t: Binary(t[1], t[0], t[2])),
                     divided.map(lambda t: Binary(t[1], t[0], t[2])))


@settings(max_examples=300, deadline=None)
@given(st.recursive(_leaf, _combine, max_leaves=8), st.integers(1, 5), st.integers(-3, 3))
def test_simplified_expressions_keep_their_values(expr, n, c):
    split = Binary("+", Binary("*", Binary("%", expr, Const(n)), Const(c)),
                   Binary("*", Binary("//", expr, Const(n)), Const(c * n)))
    for e in (expr, split):
        _same_everywhere(e, simplify(e, EXTENTS))
