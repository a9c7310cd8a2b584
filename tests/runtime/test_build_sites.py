"""Where a node says it was created (ops/node.py), and which line an error names: the user's,
also for the package's own benchmark programs, and per thread while another thread builds inside
`located()`."""
import os
import threading

import pytest

import metagraph as mg
from metagraph.errors import PROGRAM_FILES
from metagraph.ops.node import located


def test_nodes_a_benchmark_program_builds_record_its_line():
    """`python -m metagraph.bench` is a user of the package: its `a + 1` names bench.py's line, not
    runpy's (where the walk out of the package ended before)."""
    program = os.path.join(os.path.dirname(mg.__file__), "bench.py")
    assert program in PROGRAM_FILES
    scope = {"x": mg.zeros(3)}
    exec(compile("\n\ny = x + 1\n", program, "exec"), scope)
    assert scope["y"].node.location == (program, 3)


def test_an_error_in_a_benchmark_program_names_its_line():
    program = os.path.join(os.path.dirname(mg.__file__), "bench.py")
    scope = {"x": mg.zeros(3), "y": mg.zeros(4)}
    with pytest.raises(mg.MetagraphError, match=r"at bench.py:3\b"):
        exec(compile("\n\nz = x + y\n", program, "exec"), scope)


def test_a_thread_builds_with_its_own_site_while_another_is_located():
    x = mg.zeros(3)
    built, inside, leave = [], threading.Event(), threading.Event()

    def other():
        inside.wait()
        built.append(x + 1)
        leave.set()
    worker = threading.Thread(target=other)
    worker.start()
    with located(("elsewhere.py", 7)):
        inside.set()
        leave.wait()
        mine = x + 1
    worker.join()
    assert mine.node.location == ("elsewhere.py", 7)
    assert built[0].node.location[0] == __file__
