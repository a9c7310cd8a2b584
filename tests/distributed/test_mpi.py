"""metagraph.distributed on two real ranks: each test launches one of the mpi_*.py scripts beside it
with `mpirun -n 2` (oversubscription allowed, one thread per rank) and reads what the ranks print.
A subprocess timeout makes a hang a failure. Skipped only where mpi4py or mpirun is missing (the
`test` extra installs both)."""
import importlib.util
import os
import signal
import subprocess

import pytest

from metagraph.distributed.launch import find_mpirun, mpirun_command, mpirun_environment

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120           # seconds: a job that hangs fails the test instead of the suite

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or find_mpirun() is None,
                                reason="mpi4py or mpirun is not installed (pip install -e '.[distributed]')")


def launch(script):
    """Run tests/distributed/<script> on 2 ranks; returns (exit status, stdout + stderr). A job still
    running after TIMEOUT is a failure: mpirun is told to stop (it ends its ranks), then its whole
    process group is killed, so that no rank is left spinning in a collective."""
    process = subprocess.Popen(mpirun_command(2, [os.path.join(HERE, script)]),
                               env=mpirun_environment(threads=1), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        pytest.fail(f"{script} on 2 ranks did not finish in {TIMEOUT} s (a hang?):\n{output}")


def test_every_collective_matches_numpy_and_disagreeing_ranks_raise():
    status, output = launch("mpi_collectives.py")
    assert status == 0, output
    for rank in range(2):
        assert f"rank {rank}: collectives ok" in output, output


def test_ddp_on_two_ranks_trains_what_one_process_trains_on_both_batches():
    status, output = launch("mpi_ddp.py")
    assert status == 0, output
    for rank in range(2):
        assert f"rank {rank}: ddp ok" in output, output


def test_a_rank_that_raises_ends_the_job_with_its_error():
    status, output = launch("mpi_raise.py")
    assert status != 0, output
    assert "ValueError: rank 1 fails on purpose" in output, output
    assert "rank 1 of 2 raised ValueError; aborting every rank" in output, output
    assert "rank 0 was not stopped" not in output, output
