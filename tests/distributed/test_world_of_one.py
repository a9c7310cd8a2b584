"""metagraph.distributed in one process (no MPI launcher): the group is a world of one, every
collective leaves its tensors' values, bad arguments are errors that say what was expected, and an
uncaught exception calls the world's abort. test_mpi.py runs the same API on two real ranks."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import metagraph as mg
import metagraph.distributed as dist
from metagraph.distributed import world as worlds


def test_the_group_is_a_world_of_one_without_a_launcher():
    dist.init_process_group("gloo")
    assert dist.is_initialized() and dist.is_available()
    assert (dist.get_rank(), dist.get_world_size()) == (mg.rank, mg.world_size) == (0, 1)
    assert mg.in_mpi is False and dist.in_mpi() is False
    dist.barrier()


def test_importing_and_using_it_outside_mpi_imports_no_mpi4py():
    program = ("import sys, metagraph as mg, metagraph.distributed as dist\n"
               "t = mg.ones(3); dist.all_reduce(t); dist.barrier()\n"
               "model = mg.nn.parallel.DistributedDataParallel(mg.nn.Linear(2, 2))\n"
               "print(mg.rank, mg.world_size, mg.in_mpi, 'mpi4py' in sys.modules)\n")
    launcher = worlds.SIZE_VARIABLES + worlds.RANK_VARIABLES
    environment = {k: v for k, v in os.environ.items() if k not in launcher}
    result = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1", "False", "False"]


def test_a_launcher_without_mpi4py_gives_a_world_of_one_with_a_warning(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setattr(worlds, "mpi_available", lambda: False)
    with pytest.warns(UserWarning, match="started 2 processes but mpi4py is not installed"):
        world = worlds.make_world()
    assert world.size == 1 and not world.uses_mpi
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert worlds.make_world().size == 1


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"])
def test_launchers_are_told_by_their_environment(monkeypatch, variable):
    for name in worlds.SIZE_VARIABLES + worlds.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert worlds.launched_size() is None
    monkeypatch.setenv(variable, "3")
    assert worlds.launched_size() == (0 if variable == "PMIX_RANK" else 3)


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "MIN", "PRODUCT"])
@pytest.mark.parametrize("dtype", [mg.float32, mg.float64, mg.float16, mg.int64, mg.bool])
def test_every_collective_of_one_rank_keeps_the_values(op, dtype):
    values = np.random.default_rng(0).uniform(-3, 3, (2, 3))
    value = mg.tensor(values).to(dtype)
    want = value.numpy().copy()
    if op == "AVG" and not dtype.is_float:
        with pytest.raises(mg.DTypeError, match="AVG of a"):
            dist.all_reduce(value, dist.ReduceOp.AVG)
        return
    reduced = value * 1 if dtype != mg.bool else value.clone()
    assert dist.all_reduce(reduced, getattr(dist.ReduceOp, op)) is None
    np.testing.assert_array_equal(reduced.numpy(), want)
    gathered = [mg.zeros(2, 3, dtype=dtype)]
    dist.all_gather(gathered, value)
    np.testing.assert_array_equal(gathered[0].numpy(), want)
    whole = mg.zeros(1, 2, 3, dtype=dtype)
    dist.all_gather_into_tensor(whole, value)
    np.testing.assert_array_equal(whole.numpy(), want[None])
    scattered = mg.zeros(2, 3, dtype=dtype)
    dist.reduce_scatter(scattered, [value], getattr(dist.ReduceOp, op))
    np.testing.assert_array_equal(scattered.numpy(), want)
    dist.reduce_scatter_tensor(scattered, whole.reshape(2, 3), getattr(dist.ReduceOp, op))
    np.testing.assert_array_equal(scattered.numpy(), want)
    dist.broadcast(value, src=0)
    np.testing.assert_array_equal(value.numpy(), want)


def test_collectives_report_to_the_profiler_and_return_work_when_asked():
    with mg.profile() as report:
        work = dist.all_reduce(mg.ones(8), async_op=True)
        dist.broadcast(mg.ones(4, dtype=mg.float64), 0)
    assert work.wait() and work.is_completed()
    assert (report.collective_calls, report.collective_bytes) == (2, 64)
    assert "collectives 2, 0.0 MiB" in report.table()
    names = [event.name for event in report.events if event.category == "collective"]
    assert names == ["all_reduce", "broadcast"]


def test_bad_arguments_name_the_collective_and_what_was_expected():
    x = mg.ones(2, 3)
    cases = [
        (lambda: dist.all_reduce(x, "mean"), mg.ArgumentError, "all_reduce: op must be one of"),
        (lambda: dist.all_reduce(np.ones(3), "avg"), mg.ArgumentError, "expected a metagraph Tensor, got nd"),
        (lambda: dist.reduce_scatter_tensor(x, [x]), mg.ArgumentError, "expected a metagraph Tensor, got li"),
        (lambda: dist.broadcast(x, src=1), mg.ArgumentError, "src=1 is not a rank of this world of 1"),
        (lambda: dist.all_gather([x, x], x), mg.ArgumentError, r"holds 2 tensor\(s\) but the world has 1"),
        (lambda: dist.all_gather([mg.ones(3)], x), mg.ShapeError, r"tensor_list\[0\] is float32 \(3,\)"),
        (lambda: dist.reduce_scatter(x, x), mg.ArgumentError, "input_list must be a list of Tensors"),
        (lambda: dist.all_gather_into_tensor(mg.ones(3, 3), x), mg.ShapeError, r"cannot hold 1 rank\(s\) x"),
        (lambda: dist.reduce_scatter_tensor(x, x.long()), mg.DTypeError, "different dtypes"),
        (lambda: dist.all_reduce(x, group="other"), mg.Unsupported, "only the default group"),
        (lambda: dist.init_process_group("nccl"), mg.Unsupported, "backend 'nccl' is not available"),
        (lambda: dist.init_process_group(init_method="tcp://10.0.0.1:23456"), mg.Unsupported, "mpirun"),
        (lambda: dist.init_process_group(world_size=4), mg.ArgumentError, "world_size=4, but the launcher"),
        (lambda: dist.init_process_group(rank=2), mg.ArgumentError, "rank=2, but the launcher made this"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message):
            call()
    dist.all_reduce(x, group=dist.group.WORLD)          # the default group by its PyTorch name


def test_destroy_then_init_again():
    dist.init_process_group()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    assert dist.get_world_size() == 1 and dist.is_initialized()      # made again on first use


class _RecordingWorld(worlds.LocalWorld):
    rank, size = 1, 2

    def __init__(self):
        self.aborted = None

    def abort(self, code):
        self.aborted = code


def test_an_uncaught_exception_prints_its_traceback_then_aborts_every_rank(monkeypatch, capsys):
    world = _RecordingWorld()
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(value))
    remove = worlds.install_abort_hook(world)
    try:
        error = ValueError("boom")
        sys.excepthook(ValueError, error, None)
    finally:
        remove()
    assert printed == [error] and world.aborted == 1
    assert "rank 1 of 2 raised ValueError; aborting every rank" in capsys.readouterr().err
    assert sys.excepthook is not None and world.aborted == 1
    sys.excepthook(KeyError, KeyError("after"), None)        # removed: the previous hook only
    assert printed[-1].args == ("after",) and world.aborted == 1
