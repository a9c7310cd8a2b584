"""The pending graph's structural key: equal for graphs that may share a schedule, and only then."""
import math

import numpy as np

import metagraph as mg
from metagraph.compiler.graph import pending_graph


def _key(tensor):
    return pending_graph([tensor.node]).key


def _ones():
    return mg.tensor(np.ones(3, dtype=np.float32))


def test_structurally_equal_graphs_share_a_key():
    assert _key(mg.exp(_ones()) * 2.0) == _key(mg.exp(_ones()) * 2.0)
    assert _key(mg.exp(_ones()) * 2.0) != _key(mg.exp(_ones()) * 3.0)


def test_a_constant_of_the_other_sign_of_zero_is_another_graph():
    assert _key(_ones() * 0.0) != _key(_ones() * -0.0)
    assert np.signbit((_ones() * 0.0).numpy()).tolist() == [False] * 3
    assert np.signbit((_ones() * -0.0).numpy()).tolist() == [True] * 3    # not the 0.0 kernel


def test_a_nan_constant_finds_its_graph_again():
    assert _key(_ones() * math.nan) == _key(_ones() * math.nan)
