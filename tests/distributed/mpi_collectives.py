"""Run by test_mpi.py under `mpirun -n 2`: every collective against numpy on random tensors, and the
errors of ranks that disagree. Each rank draws its data from a seed of its rank, so every rank can
draw every other rank's too and compute the expected results with numpy. Prints "collectives ok"."""
import numpy as np

import metagraph as mg
import metagraph.distributed as dist

dist.init_process_group("mpi")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
assert SIZE == 2 and mg.world_size == 2 and mg.rank == RANK and mg.in_mpi


def data(rank, shape, dtype, salt):
    generator = np.random.default_rng([rank, salt])
    if dtype == np.bool_:
        return generator.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return generator.integers(-5, 6, shape).astype(dtype)
    return generator.uniform(-2, 2, shape).astype(dtype)


def everyone(shape, dtype, salt):
    return [data(rank, shape, dtype, salt) for rank in range(SIZE)]


NUMPY_REDUCTIONS = {"sum": lambda xs: np.sum(xs, 0), "avg": lambda xs: np.mean(xs, 0),
                    "max": lambda xs: np.max(xs, 0), "min": lambda xs: np.min(xs, 0),
                    "product": lambda xs: np.prod(xs, 0)}
TOLERANCE = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}

salt = 0
for dtype in (np.float32, np.float64, np.float16, np.int64, np.int32, np.bool_):
    for op in ("sum", "avg", "max", "min", "product"):
        if op == "avg" and np.dtype(dtype).kind != "f":
            continue
        salt += 1
        values = everyone((3, 5), dtype, salt)
        tensor = mg.tensor(values[RANK])
        kept = tensor.clone()
        dist.all_reduce(tensor, getattr(dist.ReduceOp, op.upper() if op != "product" else "PRODUCT"))
        if dtype == np.bool_:
            want = np.any(values, 0) if op in ("sum", "max") else np.all(values, 0)
        else:
            stacked = np.stack(values).astype(np.float64 if np.dtype(dtype).kind == "f" else dtype)
            want = NUMPY_REDUCTIONS[op](stacked)
        np.testing.assert_allclose(tensor.numpy().astype(np.float64), np.asarray(want, np.float64),
                                   rtol=TOLERANCE.get(dtype, 0), err_msg=f"all_reduce {op} {dtype}")
        np.testing.assert_array_equal(kept.numpy(), values[RANK])       # a clone keeps the old value

    for src in range(SIZE):
        salt += 1
        values = everyone((4,), dtype, salt)
        tensor = mg.tensor(values[RANK])
        dist.broadcast(tensor, src=src)
        np.testing.assert_array_equal(tensor.numpy(), values[src])

    salt += 1
    values = everyone((2, 3), dtype, salt)
    gathered = [mg.zeros(2, 3, dtype=mg.tensor(values[0]).dtype) for _ in range(SIZE)]
    dist.all_gather(gathered, mg.tensor(values[RANK]))
    for got, want in zip(gathered, values):
        np.testing.assert_array_equal(got.numpy(), want)
    for stacked in (False, True):
        output = mg.zeros(*((SIZE, 2, 3) if stacked else (SIZE * 2, 3)), dtype=gathered[0].dtype)
        dist.all_gather_into_tensor(output, mg.tensor(values[RANK]))
        np.testing.assert_array_equal(output.numpy(), np.stack(values).reshape(output.shape))

    if dtype != np.bool_:
        salt += 1
        chunks = [everyone((3,), dtype, salt * 10 + k) for k in range(SIZE)]   # chunks[k][rank]
        output = mg.zeros(3, dtype=gathered[0].dtype)
        dist.reduce_scatter(output, [mg.tensor(chunks[k][RANK]) for k in range(SIZE)], dist.ReduceOp.SUM)
        want = np.sum(np.stack(chunks[RANK]).astype(np.float64), 0)
        np.testing.assert_allclose(output.numpy().astype(np.float64), want, rtol=TOLERANCE.get(dtype, 0))
        whole = np.concatenate([chunks[k][RANK] for k in range(SIZE)])
        output = mg.zeros(3, dtype=gathered[0].dtype)
        dist.reduce_scatter_tensor(output, mg.tensor(whole), dist.ReduceOp.MAX)
        np.testing.assert_array_equal(output.numpy(), np.max(np.stack(chunks[RANK]), 0))

# A collective's input may be a pending computation and a parameter (a leaf that requires grad).
parameter = mg.nn.Parameter(mg.full((2, 2), float(RANK + 1)))
dist.all_reduce(parameter * 1, dist.ReduceOp.SUM)
dist.all_reduce(parameter, dist.ReduceOp.AVG)
assert parameter.requires_grad and parameter.is_leaf
np.testing.assert_array_equal(parameter.numpy(), np.full((2, 2), 1.5, np.float32))

# mg.profile() counts the collectives.
with mg.profile() as report:
    dist.all_reduce(mg.ones(256))
    dist.barrier()
assert report.collective_calls == 2 and report.collective_bytes == 1024, report.table()
assert "collectives 2" in report.table()

# Ranks that disagree all raise the same error, naming every rank's call.
try:
    dist.all_reduce(mg.ones(3 + RANK))
except dist.DistributedError as error:
    message = str(error)
    assert "rank 0: all_reduce(sum) float32 (3,)" in message, message
    assert "rank 1: all_reduce(sum) float32 (4,)" in message, message
else:
    raise AssertionError("all_reduce of different shapes did not raise")
try:
    dist.broadcast(mg.ones(2), src=RANK)
except dist.DistributedError as error:
    assert "src=0" in str(error) and "src=1" in str(error), error
else:
    raise AssertionError("broadcast from different sources did not raise")
try:
    dist.all_reduce(mg.ones(2, dtype=mg.float64 if RANK else mg.float32))
except dist.DistributedError as error:
    assert "float64" in str(error) and "float32" in str(error), error
else:
    raise AssertionError("all_reduce of different dtypes did not raise")
# A world-size mismatch: a list with one tensor per rank, in a world of two.
try:
    dist.all_gather([mg.zeros(2)], mg.ones(2))
except mg.ArgumentError as error:
    assert "holds 1 tensor(s) but the world has 2 rank(s)" in str(error), error
else:
    raise AssertionError("all_gather into a list of the wrong length did not raise")
try:
    dist.reduce_scatter_tensor(mg.zeros(2), mg.ones(3))
except mg.ShapeError as error:
    assert "cannot hold 2 rank(s)" in str(error), error
else:
    raise AssertionError("reduce_scatter_tensor of a wrong size did not raise")

# After the errors, the ranks still agree.
check = mg.tensor([float(RANK)])
dist.all_reduce(check)
assert check.item() == 1.0
dist.barrier()
print(f"rank {RANK}: collectives ok", flush=True)
