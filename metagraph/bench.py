"""The benchmark suite: metagraph against PyTorch (when installed) on the same work, in one run.

    python -m metagraph.bench                  # every workload, a table and bench.json
    python -m metagraph.bench --only W1,W3a,K1 # some of them (K1: the group K1a-K1e)
    python -m metagraph.bench --threads 1      # both frameworks (and numpy's BLAS) on one thread
    python -m metagraph.bench --backends       # the llvm, bang and opencl code generators against c
    python -m metagraph.bench --library        # contractions through numpy's BLAS (library_op)
    python -m metagraph.bench --distributed    # D1: ResNet-18 training on 2 MPI ranks (bench_distributed.py)
    python -m metagraph.bench --amp            # A1-A3: bfloat16 autocast against float32 and PyTorch
                                               # (bench_amp.py)

Workloads:
    W1-W9     element-wise, softmax, matmul, conv, ResNet-18 and VGG-11 inference and training,
              launch overhead, time to train an MLP (this file; matmul, conv and the networks are
              built by bench_kernels.py and bench_zoo.py)
    W10-W12   transformer block, GPT training step, LSTM (bench_transformer.py, bench_sequence.py)
    K1a-K4    single kernels: matmul at five shapes (K1d: as a fraction of the machine's roof, the
              best sgemm of PyTorch and numpy in the same run), 3x3 conv forward and forward+backward
              (K2s: stride 2), 1x1 and depthwise conv, LayerNorm (bench_kernels.py)
    Z1, Z2    ResNet-50 inference at batch 4; batch-1 inference of every zoo network with a PyTorch
              twin, and their geometric mean (bench_zoo.py)
    S         S1-S4: ResNet-18 training's first step in a fresh process (warm and empty cache),
              peak memory, Python per step; S5: kernels compiled and memory held over batch sizes
              1..200 (S5f: against a process that ran size 200 alone); each framework in a
              process of its own (bench_startup.py)

Each figure is the median of at least --repeat timed calls after two warm-up calls, every call
forced to complete (read back to numpy); short workloads are called again until a second has
passed (at most 200 calls), so that their medians rest on more than a few samples. metagraph and
PyTorch calls alternate, so that noise from the shared machine falls on both. Each workload's
warm-up calls tune its kernels as in a process of its own (METAGRAPH_TUNE seconds; the choices
are remembered on disk, so a later run times nothing). Ratios are torch time / metagraph time:
above 1, metagraph is faster. PyTorch runs on as many threads as metagraph:
--threads N, else METAGRAPH_NUM_THREADS, else the CPUs this process may use."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.bench_kernels import WORKLOADS as kernel_workloads, conv, matmul, random_array
from metagraph.bench_transformer import WORKLOADS as transformer_workloads, training_step
from metagraph.bench_zoo import WORKLOADS as zoo_workloads, geometric_mean, inference, twin


MIN_SECONDS = 1.0        # time each workload for at least this long (wall clock) ...
MAX_ROUNDS = 200         # ... in at most this many rounds


def median_seconds(fns, repeat, warmup=2):
    """The median time of each of `fns`, timed in alternation (one call of each per round), so
    that a noisy neighbour slows both sides of a comparison alike, not whichever ran then. At least
    `repeat` rounds, more while under MIN_SECONDS."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    began = time.perf_counter()
    rounds = 0
    while rounds < repeat or (time.perf_counter() - began < MIN_SECONDS and rounds < MAX_ROUNDS):
        for fn, seconds in zip(fns, times):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        rounds += 1
    return [statistics.median(seconds) for seconds in times]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(mg.flags.NUM_THREADS)      # as many threads as metagraph's kernels use
    return torch


# ---- workloads: each returns (metagraph fn, torch fn or None, unit, work[, references]) ---------

def w1(torch):
    data = random_array(2 ** 24)
    x = mg.tensor(data)
    ours = lambda: (F.relu(x * 1.5 + 0.5) * F.sigmoid(x)).numpy()  # noqa: E731
    theirs = None
    if torch:
        t = torch.from_numpy(data)
        theirs = lambda: (torch.relu(t * 1.5 + 0.5) * torch.sigmoid(t)).numpy()  # noqa: E731
    return ours, theirs, "GB/s", 2 ** 27


def w2(torch):
    data = random_array(4096, 1024)
    x = mg.tensor(data)
    theirs = (lambda t: (lambda: torch.softmax(t, 1).numpy()))(torch.from_numpy(data)) if torch else None
    return (lambda: F.softmax(x, dim=1).numpy()), theirs, "ms", None


def resnet18_training(batch, size):
    """A workload: a ResNet-18 training step (SGD with momentum) on (batch, 3, size, size), in
    images/s."""
    return lambda torch: _resnet18_training(torch, batch, size)


def _resnet18_training(torch, batch, size):
    data, labels = random_array(batch, 3, size, size), np.random.default_rng(0).integers(0, 10, batch)
    model = mg.models.resnet18(num_classes=10)
    x, y = mg.tensor(data), mg.tensor(labels)
    ours = training_step(lambda: F.cross_entropy(model(x), y),
                         mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    theirs = None
    if torch:
        reference = twin(torch, "resnet18", model, num_classes=10).train()
        tx, ty = torch.from_numpy(data), torch.from_numpy(labels)
        theirs = training_step(lambda: torch.nn.functional.cross_entropy(reference(tx), ty),
                               torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9))
    return ours, theirs, "images/s", batch


def w7(torch):
    def chain(start, add):
        def run():
            a = start()
            for _ in range(1000):
                a = add(a)
            return a
        return run
    ours = lambda: chain(lambda: mg.zeros(16), lambda a: a + 1)().numpy()  # noqa: E731
    theirs = (lambda: chain(lambda: torch.zeros(16), lambda a: a + 1)().numpy()) if torch else None
    return ours, theirs, "us/op", 1000


WORKLOADS = {
    "W1": ("fused element-wise relu(x*1.5+0.5)*sigmoid(x), 2^24", w1),
    "W2": ("row softmax 4096x1024", w2),
    "W3a": ("matmul 1024^3", matmul(1024, 1024, 1024)),
    "W3b": ("matmul 256^3", matmul(256, 256, 256)),
    "W4": ("conv2d 3x3, (8,64,56,56) -> 64", conv(8, 64, 64, 56, 3)),
    "W5": ("ResNet-18 inference, batch 8, 224^2", inference("resnet18", 8)),
    "W6": ("ResNet-18 training step, batch 32, 32^2", resnet18_training(32, 32)),
    "W6l": ("ResNet-18 training step, batch 8, 224^2", resnet18_training(8, 224)),
    "W7": ("1000 x (a + 1) on 16 floats, then read", w7),
    "W9": ("VGG-11 inference, batch 4, 224^2", inference("vgg11", 4)),
    **transformer_workloads,
    **kernel_workloads,
    **zoo_workloads,
}


def _figure(unit, work, seconds):
    if unit == "ms":
        return seconds * 1e3
    if unit == "us/op":
        return seconds / work * 1e6
    if unit == "GB/s":
        return work / seconds / 1e9
    if unit == "GFLOP/s":
        return work / seconds / 1e9
    return work / seconds            # images/s


COLD_PROGRAM = """
import time, metagraph as mg
model = mg.models.resnet18().eval()
x = mg.randn(8, 3, 224, 224)
start = time.perf_counter()
with mg.no_grad():
    model(x).numpy()
print(time.perf_counter() - start)
"""


def cold_resnet18():
    """Seconds of ResNet-18's first forward in a fresh process with an empty kernel cache."""
    with tempfile.TemporaryDirectory() as cache:
        environment = dict(os.environ, METAGRAPH_CACHE_DIR=cache,
                           METAGRAPH_NUM_THREADS=str(mg.flags.NUM_THREADS))
        result = subprocess.run([sys.executable, "-c", COLD_PROGRAM], env=environment, capture_output=True,
                                text=True, timeout=3600)
    return float(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else float("nan")


def digits_time_to_95(max_epochs=50):
    """W8: seconds until a 64-128-10 MLP reaches 95% test accuracy on digits, and the final accuracy."""
    mg.manual_seed(0)
    train = mg.data.DataLoader(mg.datasets.digits(train=True), batch_size=64, shuffle=True)
    x_test, y_test = mg.datasets.digits(train=False).arrays
    model = mg.nn.Sequential(mg.nn.Flatten(), mg.nn.Linear(64, 128), mg.nn.ReLU(), mg.nn.Linear(128, 10))
    optimizer = mg.optim.Adam(model.parameters(), lr=1e-3)
    start, reached, accuracy = time.perf_counter(), None, 0.0
    for _ in range(max_epochs):
        for x, y in train:
            optimizer.step(F.cross_entropy(model(x), y))
        with mg.no_grad():
            accuracy = float((model(mg.tensor(x_test)).argmax(1).numpy() == y_test).mean())
        if accuracy >= 0.95 and reached is None:
            reached = time.perf_counter() - start
            break
    return reached, accuracy


BACKEND_WORKLOADS = {
    "W1": ("fused element-wise chain, 2^24 floats", w1),
    "W2": ("row softmax 4096x1024", w2),
    "M512": ("matmul 512^3", matmul(512, 512, 512)),
}


def compare_backends(repeat, json_path):
    """The same workloads on every code generator that works here, in one run; ratio = c time /
    backend time (above 1: faster than c)."""
    names = []
    for name in ("c", "llvm", "bang", "opencl"):      # opencl: inputs stay on its device, results come back
        try:
            mg.set_backend(name)
            names.append(name)
        except mg.MetagraphError as error:
            print(f"backend {name} unavailable: {str(error).splitlines()[0]}")
    print(f"{mg.flags.NUM_THREADS} threads; milliseconds per call (median of {repeat}), ratio = c / backend")
    rows = []
    for key, (title, make) in BACKEND_WORKLOADS.items():
        ours = make(None)[0]
        row = {"id": key, "workload": title, "ms": {}}
        for name in names:
            mg.set_backend(name)
            row["ms"][name] = median_seconds([ours], repeat)[0] * 1e3
        if "c" in row["ms"]:
            row["ratio_to_c"] = {name: row["ms"]["c"] / ms for name, ms in row["ms"].items()}
        rows.append(row)
        ratios = row.get("ratio_to_c", {})
        cells = "  ".join(f"{name} {ms:8.2f}" + (f" ({ratios[name]:.2f})" if ratios else "")
                          for name, ms in row["ms"].items())
        print(f"{key:<5} {title:<40} {cells}", flush=True)
    with open(json_path, "w") as stream:
        json.dump(rows, stream, indent=1)
    print(f"wrote {json_path}")


def set_threads(count):
    """--threads: metagraph's kernels, PyTorch's ops (see _torch) and, when threadpoolctl is installed,
    numpy's BLAS (K1d's roof, --library) on `count` threads. Call it before the first kernel runs:
    a backend reads the count when it is loaded."""
    mg.flags.NUM_THREADS = count
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpoolctl is not installed: numpy's BLAS keeps its own thread count", file=sys.stderr)
        return
    threadpool_limits(count, user_api="blas")


def chosen_ids(only, ids):
    """The ids --only names: each item an id, or a prefix that is not one and names a group (K1 runs
    K1a-K1e, Z2 runs Z2a-Z2e); an item that matches nothing raises ValueError."""
    chosen = set()
    for item in only.split(","):
        matches = {item} if item in ids else {key for key in ids if key.startswith(item)}
        if not matches:
            raise ValueError(f"--only {item}: no such workload or group; ids are {', '.join(ids)}")
        chosen |= matches
    return chosen


def _fresh_tuning_budget():
    """Each workload tunes its kernels as in a process of its own (METAGRAPH_TUNE seconds): the
    budget is a process's, and one bench process runs every workload, so the later ones were
    measured untuned (their choices remembered only by a later run)."""
    tuner = getattr(mg.backend._instance(mg.get_backend()), "tuner", None)
    if tuner is not None:
        tuner.spent = 0.0


def measure(key, title, make, torch, repeat):
    """One row: metagraph's figure, PyTorch's and the ratio when PyTorch is installed and, for a
    workload that names reference implementations (a fifth element, name -> fn), their figures and
    the roof: the best figure other than metagraph's. References are timed after, not in the same
    rounds: numpy's OpenBLAS threads slowed the next call of a 2-thread kernel from 211 to 130
    GFLOP/s (PyTorch's threads do not)."""
    _fresh_tuning_budget()
    ours, theirs, unit, work, *more = make(torch)
    references = more[0] if more else {}
    fns = [ours] + ([theirs] if theirs is not None else [])
    mine, *others = median_seconds(fns, repeat)
    others += median_seconds(list(references.values()), repeat) if references else []
    row = {"id": key, "workload": title, "unit": unit, "metagraph": _figure(unit, work, mine)}
    if theirs is not None:
        seconds = others.pop(0)
        row["pytorch"] = _figure(unit, work, seconds)
        row["ratio"] = seconds / mine
    if references:
        row["references"] = {name: _figure(unit, work, seconds) for name, seconds in zip(references, others)}
        row["roof"] = max([row.get("pytorch", 0.0), *row["references"].values()])
        row["of_roof"] = row["metagraph"] / row["roof"]
    return row


def main(argv=None):
    ids = list(WORKLOADS) + ["W8", "S"]
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated workload ids ({', '.join(ids)}) or groups "
                                       "(a prefix: K1, Z2)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="bench.json")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-start measurement")
    parser.add_argument("--threads", type=int,
                        help="threads for metagraph, PyTorch and numpy's BLAS (default: "
                             "METAGRAPH_NUM_THREADS, else the CPUs this process may use)")
    parser.add_argument("--library", action="store_true",
                        help="run einsum-like contractions through numpy's BLAS (METAGRAPH_LIBRARY=1)")
    parser.add_argument("--backends", action="store_true",
                        help="compare the code generators (c, llvm, bang) instead of PyTorch")
    parser.add_argument("--distributed", action="store_true",
                        help="D1: ResNet-18 training on 2 MPI ranks x 1 thread against 1 process x 2 threads")
    parser.add_argument("--amp", action="store_true",
                        help="A1-A3: bfloat16 autocast against float32 and PyTorch's autocast (bench_amp.py)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        set_threads(args.threads)
    if args.backends:
        compare_backends(args.repeat, args.json)
        return
    if args.amp:
        from metagraph.bench_amp import rows as amp_rows
        with open(args.json, "w") as stream:
            json.dump(amp_rows(repeat=args.repeat), stream, indent=1)
        print(f"wrote {args.json}")
        return
    if args.distributed:
        from metagraph.bench_distributed import describe, rows as distributed_rows
        rows = distributed_rows()
        print("\n".join(describe(row) for row in rows))
        with open(args.json, "w") as stream:
            json.dump(rows, stream, indent=1)
        print(f"wrote {args.json}")
        return
    try:
        chosen = chosen_ids(args.only, ids) if args.only else set(ids)
    except ValueError as error:
        parser.error(str(error))
    torch = _torch()
    mg.flags.LIBRARY = 1 if args.library else mg.flags.LIBRARY
    print(f"metagraph {mg.get_backend()} backend, {mg.flags.NUM_THREADS} threads, "
          f"contractions {'through the BLAS numpy links' if mg.flags.LIBRARY else 'generated'}; "
          f"PyTorch {torch.__version__ if torch else 'not installed'}", flush=True)
    rows = []
    for key, (title, make) in WORKLOADS.items():
        if key in chosen:
            rows.append(measure(key, title, make, torch, args.repeat))
            print(_format(rows[-1]), flush=True)
    if summary := geometric_mean(rows):
        rows.append(summary)
        print(_format(summary), flush=True)
    if "W8" in chosen:
        seconds, accuracy = digits_time_to_95()
        row = {"id": "W8", "workload": "digits MLP, seconds to 95% test accuracy", "unit": "s",
               "metagraph": seconds, "final_accuracy": accuracy}
        rows.append(row)
        print(_format(row), flush=True)
    if "S" in chosen:
        from metagraph.bench_startup import rows as startup_rows
        for row in startup_rows(mg.flags.NUM_THREADS, torch is not None, cold=not args.no_cold):
            rows.append(row)
            print(_format(row), flush=True)
    if "W5" in chosen and not args.no_cold:
        row = {"id": "W5cold", "workload": "ResNet-18 first forward, fresh process, empty cache", "unit": "s",
               "metagraph": cold_resnet18()}
        rows.append(row)
        print(_format(row), flush=True)
    with open(args.json, "w") as stream:
        json.dump(rows, stream, indent=1)
    print(f"wrote {args.json}")


def _format(row):
    def number(value):
        return "-" if value is None else f"{value:.3g}"
    text = f"{row['id']:<7} {row['workload']:<55} {row['unit']:<9} metagraph {number(row['metagraph']):>8}"
    if "pytorch" in row:
        text += f"  pytorch {number(row['pytorch']):>8}  ratio {row['ratio']:.2f}"
    for name, figure in row.get("references", {}).items():
        text += f"  {name} {number(figure):>8}"
    if "of_roof" in row:
        text += f"  metagraph/roof {row['of_roof']:.2f}"
    if "final_accuracy" in row:
        text += f"  final accuracy {row['final_accuracy']:.3f}"
    return text


if __name__ == "__main__":
    main()
