"""A check that fails inside a compiled kernel is reported as the numpy backend reports it: the
offending index value, the op and the user's line, on every backend."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from tests.backends.conftest import BACKENDS, backend  # noqa: F401

CASES = [
    (lambda: F.embedding(mg.tensor([1, 100]), mg.randn(10, 3)), r"\(100, "),
    (lambda: mg.randn(4, 5).gather(1, mg.tensor(np.full((4, 2), 7))), r"\(0, 7\)"),
    (lambda: mg.randn(6)[mg.tensor([0, 2, -9])], r"-9|\(-3"),
]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_an_out_of_range_index_is_named_with_its_value_and_the_users_line(backend, case):
    build, value = CASES[case]
    with pytest.raises(IndexError, match=value) as error:
        build().numpy()
    assert "test_run_time_errors.py" in str(error.value)
