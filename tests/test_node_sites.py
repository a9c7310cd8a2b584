"""Where a node was created: found from the user's frame when the node is built, turned into a line
only when asked (an error, a test), and the same line a traceback would show."""
import copy
import pickle
import sys

import pytest

import metagraph as mg
from metagraph import nn


def test_a_node_built_at_the_end_of_a_long_script_names_its_line(tmp_path):
    """Module-level code of a long script, where training loops live: its line is right (a frame's
    f_lineno there scans the whole line table, which is why the line is found only when asked)."""
    filler = "".join(f"v{k} = {k}\n" for k in range(600))
    source = "import metagraph as mg\nx = mg.ones(3)\n" + filler + "y = (x + 1) * 2\n"
    path = str(tmp_path / "script.py")
    scope = {}
    exec(compile(source, path, "exec"), scope)
    line = source.count("\n")
    y = scope["y"].node
    assert y.location == (path, line) and y.inputs[0].location == (path, line)
    assert y.location is y.location          # turned into a line once


def test_nodes_built_in_a_forward_name_the_forward_not_the_caller():
    class Twice(nn.Module):
        def forward(self, x):
            return x * 2                     # the line nodes built here name

    forward_line = Twice.forward.__code__.co_firstlineno + 1
    y = Twice()(mg.ones(4))                  # called through Module.__call__, package code
    assert y.node.location == (__file__, forward_line)


def test_an_error_names_the_line_of_a_long_script(tmp_path):
    filler = "".join(f"v{k} = {k}\n" for k in range(300))
    source = "import metagraph as mg\n" + filler + "y = mg.ones(2, 3) @ mg.ones(2, 3)\n"
    path = str(tmp_path / "long_script.py")
    with pytest.raises(mg.ShapeError, match=f"long_script.py:{source.count(chr(10))}"):
        exec(compile(source, path, "exec"), {})


def test_a_lazy_tensor_pickles_and_copies_with_its_location():
    line = sys._getframe().f_lineno + 1
    x = mg.ones(3) + 1
    for again in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert again.node.location == (__file__, line)
        assert again.numpy().tolist() == [2.0, 2.0, 2.0]
