"""Index arithmetic is int64 in every kernel: an index map whose value can leave int64 (known
from the loop extents) is refused when the node is built, not wrapped silently when it runs."""
import pytest

import metagraph as mg
from metagraph.errors import ExprError
from metagraph.expr import Var, check_int64, parse


@pytest.mark.parametrize("text", ["i0*18446744073709551617", "i0*4611686018427387904*2",
                                  "(i0+9223372036854775807)", "-9223372036854775807-2+i0"])
def test_a_map_that_leaves_int64_is_refused_at_the_users_call(text):
    with pytest.raises(ExprError, match="outside int64") as error:
        mg.arange(3.).reindex([3], [text])
    assert "reindex" in str(error.value) and "test_index_overflow.py" in str(error.value)


def test_the_range_depends_on_the_extents():
    check_int64(parse("i0 * 4611686018427387904", 1), (2,))          # reaches 2^62: fits
    with pytest.raises(ExprError):
        check_int64(parse("i0 * 4611686018427387904", 1), (3,))      # reaches 2^63


def test_values_read_from_index_tensors_are_left_to_the_bounds_check():
    check_int64(parse("@e0(i0) * 1000000 + i0", 1, 1), (5,))


def test_a_long_chain_is_checked_without_recursion():
    expr = Var(0)
    for _ in range(5000):
        expr = expr + 1
    check_int64(expr, (10,))


def test_maps_inside_int64_still_compute():
    assert mg.arange(3.).reindex([3], ["(i0 * 2305843009213693952) // 2305843009213693952"]).tolist() == \
        [0.0, 1.0, 2.0]
