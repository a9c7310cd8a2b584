"""The data-parallel rows of the benchmark suite (`python -m metagraph.bench --distributed`):

D1  ResNet-18 training (the zoo's resnet18, 10 classes, 32^2 images, SGD with momentum, global batch
    32, as W6) on 2 ranks x 1 thread, DistributedDataParallel over MPI, each rank on 16 images,
    against 1 process x 2 threads on all 32: images/s, and the time per step spent in collectives
    (mg.profile()'s collective counters on rank 0: the gradient buckets' all-reduces and the
    buffer broadcast before each forward pass, waiting for the other rank included; the same
    all-reduces started together after a barrier tell the transfer alone).

Each configuration runs in fresh processes (`python -m metagraph.bench_distributed --worker`),
so that the thread count applies from the start; the worker warms up (compiles, tunes) for
WARMUP steps, then times STEPS steps, each after a barrier, and rank 0 prints one JSON line.
Figures are medians of the steps (and the fastest step, which a busy machine disturbs least).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GLOBAL_BATCH = 32
IMAGE = 32
WARMUP = 4
STEPS = 15


def worker(steps, warmup, distributed):
    """One process's part: train ResNet-18 and (on rank 0) print the figures as a JSON line."""
    import numpy as np

    import metagraph as mg
    import metagraph.distributed as dist
    import metagraph.nn.functional as F
    from metagraph.nn.parallel import DistributedDataParallel

    rank, size = dist.get_rank(), dist.get_world_size()
    batch = GLOBAL_BATCH // size
    mg.manual_seed(0)
    model = mg.models.resnet18(num_classes=10)
    if distributed:
        model = DistributedDataParallel(model)
    generator = np.random.default_rng(rank)
    x = mg.tensor(generator.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32))
    y = mg.tensor(generator.integers(0, 10, batch))
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(warmup):
        step()
    seconds, collective_seconds, calls, nbytes = [], [], 0, 0
    for _ in range(steps):
        dist.barrier()
        with mg.profile() as report:
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        collective_seconds.append(report.collective_seconds)
        calls, nbytes = report.collective_calls, report.collective_bytes
    aligned = aligned_all_reduce_seconds(model) if distributed else 0.0
    if rank == 0:
        step_seconds = statistics.median(seconds)
        print(json.dumps({"ranks": size, "threads": mg.flags.NUM_THREADS, "ddp": distributed,
                          "images_per_s": GLOBAL_BATCH / step_seconds, "step_ms": step_seconds * 1e3,
                          "fastest_step_ms": min(seconds) * 1e3,
                          "collective_ms_per_step": statistics.median(collective_seconds) * 1e3,
                          "aligned_all_reduce_ms": aligned * 1e3,
                          "collective_calls_per_step": calls, "collective_mib_per_step": nbytes / 2 ** 20}),
              flush=True)


def aligned_all_reduce_seconds(model, repeat=5):
    """The time the all-reduces of `model`'s gradient buckets take when every rank starts them at
    once (after a barrier): the collective time of a step less this is time spent waiting for the
    slower rank."""
    import numpy as np

    from metagraph.distributed.collectives import reduce_buffers
    from metagraph.distributed.group import current_world
    from metagraph.nn.parallel import make_buckets

    world = current_world("bench")
    trained = [p for p in model.parameters() if p.requires_grad]
    flats = [np.zeros(bucket.size, bucket.dtype.np) for bucket in make_buckets(trained)]
    seconds = []
    for _ in range(repeat):
        world.barrier()
        start = time.perf_counter()
        for flat in flats:
            reduce_buffers(world, flat, flat, "sum")
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def run(ranks, threads, distributed, steps=STEPS, warmup=WARMUP):
    """The figures of one configuration, run in fresh processes (2 ranks: through mpirun)."""
    from metagraph.distributed.launch import mpirun_command, mpirun_environment
    arguments = ["-m", "metagraph.bench_distributed", "--worker", "--steps", str(steps),
                 "--warmup", str(warmup), *(["--ddp"] if distributed else [])]
    environment = mpirun_environment(threads)
    if ranks == 1:
        environment = {k: v for k, v in environment.items() if not k.startswith(("OMPI_COMM", "PMI", "PMIX"))}
        command = [sys.executable, *arguments]
    else:     # one core per rank (Open MPI binds each to its own) when the machine has enough
        command = mpirun_command(ranks, arguments, oversubscribe=ranks * threads > (os.cpu_count() or 1))
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def rows(steps=STEPS, warmup=WARMUP):
    """D1 as a row of bench.json: DDP on 2 ranks x 1 thread against 1 process x 2 threads."""
    ddp = run(2, 1, True, steps, warmup)
    alone = run(1, 2, False, steps, warmup)
    title = (f"ResNet-18 training, {IMAGE}^2, global batch {GLOBAL_BATCH}: 2 ranks x 1 thread (DDP) vs "
             "1 process x 2 threads")
    return [{"id": "D1", "workload": title,
             "unit": "images/s", "metagraph": ddp["images_per_s"],
             "references": {"1 process x 2 threads": alone["images_per_s"]},
             "ratio_to_one_process": ddp["images_per_s"] / alone["images_per_s"],
             "step_ms": ddp["step_ms"], "one_process_step_ms": alone["step_ms"],
             "fastest_step_ms": ddp["fastest_step_ms"],
             "one_process_fastest_step_ms": alone["fastest_step_ms"],
             "collective_ms_per_step": ddp["collective_ms_per_step"],
             "aligned_all_reduce_ms": ddp["aligned_all_reduce_ms"],
             "collective_calls_per_step": ddp["collective_calls_per_step"],
             "collective_mib_per_step": ddp["collective_mib_per_step"]}]


def describe(row):
    """A row as one line of text."""
    alone = row["references"]["1 process x 2 threads"]
    return (f"{row['id']:<7} {row['workload']}\n        2 ranks x 1 thread {row['metagraph']:.1f} images/s "
            f"({row['step_ms']:.0f} ms a step, {row['collective_ms_per_step']:.1f} ms of it in "
            f"{row['collective_calls_per_step']} collectives moving {row['collective_mib_per_step']:.1f} "
            f"MiB, whose all-reduces take {row['aligned_all_reduce_ms']:.1f} ms when the ranks start "
            "together); "
            f"1 process x 2 threads {alone:.1f} images/s ({row['one_process_step_ms']:.0f} ms); "
            f"ratio {row['ratio_to_one_process']:.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="be one process of a configuration")
    parser.add_argument("--ddp", action="store_true",
                        help="(worker) wrap the model in DistributedDataParallel")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps, args.warmup, args.ddp)
        return
    for row in rows(args.steps, args.warmup):
        print(describe(row), flush=True)


if __name__ == "__main__":
    main()
