"""Index expressions: parsed with ast (never evaluated), printed back, checked."""

import numpy as np
import pytest

import metagraph as mg
from metagraph.errors import ExprError
from metagraph.expr import Binary, Const, Extra, Select, Var, extras_used, parse, variables


def test_parse_builds_the_tree():
    assert parse("i0*2+i2-1", 3) == Binary("-", Binary("+", Binary("*", Var(0), Const(2)), Var(2)), Const(1))
    assert parse("-i1", 2) == Binary("-", Const(0), Var(1))
    assert parse("min(i0, 3, i1)", 2) == Binary("min", Binary("min", Var(0), Const(3)), Var(1))
    assert parse("i0 // 2 % 3", 1) == Binary("%", Binary("//", Var(0), Const(2)), Const(3))
    assert parse("i0 if i1 < 2 else 0", 2) == Select(Binary("<", Var(1), Const(2)), Var(0), Const(0))
    assert parse("@e0(i0, i1+1)", 2, 1) == Extra(0, (Var(0), Binary("+", Var(1), Const(1))))
    assert parse("i0 > 1 && i1 >= 0", 2) == Binary(
        "&&", Binary("<", Const(1), Var(0)), Binary("<=", Const(0), Var(1))
    )
    assert parse("0 <= i0 < 4", 1) == Binary(
        "&&", Binary("<=", Const(0), Var(0)), Binary("<", Var(0), Const(4))
    )


def test_round_trip_through_str():
    for text in ["i0*2+i2-1", "max(i0, i1) % 3", "(i0 if i1 == 0 else 5) // 2", "@e0(i1) + i0"]:
        tree = parse(text, 3, 1)
        assert parse(str(tree), 3, 1) == tree


def test_variables_and_extras():
    tree = parse("@e1(i0) + i2 * 3", 3, 2)
    assert variables(tree) == {0, 2}
    assert extras_used(tree) == {1}


@pytest.mark.parametrize(
    "text, match",
    [
        ("i0 +", "not valid syntax"),
        ("x + 1", "unknown name 'x'"),
        ("i3", "out of range"),
        ("i0 / 2", "unsupported syntax"),
        ("i0 ** 2", "unsupported syntax"),
        ("1.5", "not an integer"),
        ("open('f')", "unknown function"),
        ("__import__('os').system('x')", "unsupported syntax|unknown function"),
        ("(lambda: 0)()", "unsupported syntax"),
        ("i0.bit_length()", "unsupported syntax"),
        ("@e1(i0)", "2 extras|1 extras"),
        ("min(i0)", "at least two"),
        ("i0 is i1", "unsupported comparison"),
    ],
)
def test_malformed_expressions_are_errors(text, match):
    with pytest.raises(ExprError, match=match):
        parse(text, 3, 1)


def test_a_huge_or_deep_index_expression_is_refused_naming_the_limit():
    x = mg.zeros(3)
    with pytest.raises(mg.ExprError, match=r"400001 tokens, more than the limit of 10000"):
        x.reindex([3], ["i0" + "+1" * 200_000])
    with pytest.raises(mg.ExprError, match=r"nested more than 200 levels deep \(the limit\)"):
        x.reindex([3], ["i0" + "+1" * 2_000])
    built = Var(0)
    for _ in range(200_000):
        built = built + 1
    with pytest.raises(mg.ExprError, match=r"nested 200001 levels deep, more than the limit of 200"):
        x.reindex([3], [built])
    shared = Var(0)
    for _ in range(40):          # 40 nodes, read 2^40 times as a tree
        shared = shared + shared
    with pytest.raises(mg.ExprError, match=r"nodes, more than the limit of 10000"):
        x.reindex([3], [shared])


def test_an_expression_within_the_limits_still_works():
    x = mg.arange(10.0)
    np.testing.assert_array_equal(x.reindex([3], ["i0" + "+1-1" * 60]).numpy(), [0, 1, 2])
