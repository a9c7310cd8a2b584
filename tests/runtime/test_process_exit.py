"""A process that ends straight after a threaded kernel exits cleanly: the OpenMP runtime stays
mapped while its idle worker threads spin (OMP_WAIT_POLICY=active keeps them spinning to the end,
so an unmapped runtime would kill the process with SIGSEGV every time, not once in a while)."""

import os
import subprocess
import sys

import pytest

from tests.helpers import needs

PROGRAM = """
import metagraph as mg
y = (mg.rand(256, 512).exp() * 2).sum(1)
mg.sync(y)
print("done", mg.get_backend())
"""


@pytest.mark.parametrize("backend", ["c", "llvm", "bang"])
def test_exit_after_a_threaded_kernel(backend):
    needs(backend)
    environment = dict(os.environ, METAGRAPH_BACKEND=backend, METAGRAPH_NUM_THREADS="2",
                       OMP_WAIT_POLICY="active")
    result = subprocess.run([sys.executable, "-c", PROGRAM], env=environment, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.split() == ["done", backend]
