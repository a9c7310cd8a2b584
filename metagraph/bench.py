"""The benchmark suite: metagraph against PyTorch (when installed) on the same work, in one run.

    python -m metagraph.bench                 # every workload, a table and bench.json
    python -m metagraph.bench --only W1,W3a   # some of them
    python -m metagraph.bench --backends      # the llvm and bang code generators against c
    python -m metagraph.bench --library       # contractions through numpy's BLAS (library_op)

Each figure is the median of at least --repeat timed calls after two warm-up calls, every call
forced to complete (read back to numpy); short workloads are called again until a second has
passed (at most 200 calls), so that their medians rest on more than a few samples. metagraph and
PyTorch calls alternate, so that noise from the shared machine falls on both. Ratios are torch
time / metagraph time: above 1, metagraph is faster. PyTorch runs on as many threads as metagraph
(METAGRAPH_NUM_THREADS: `METAGRAPH_NUM_THREADS=1 python -m metagraph.bench` compares one core)."""
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
from metagraph.bench_transformer import WORKLOADS as transformer_workloads


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


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- workloads: each returns (metagraph fn, torch fn or None, unit, work) ----------------------

def w1(torch):
    data = _data(2 ** 24)
    x = mg.tensor(data)
    ours = lambda: (F.relu(x * 1.5 + 0.5) * F.sigmoid(x)).numpy()  # noqa: E731
    theirs = None
    if torch:
        t = torch.from_numpy(data)
        theirs = lambda: (torch.relu(t * 1.5 + 0.5) * torch.sigmoid(t)).numpy()  # noqa: E731
    return ours, theirs, "GB/s", 2 ** 27


def w2(torch):
    data = _data(4096, 1024)
    x = mg.tensor(data)
    theirs = (lambda t: (lambda: torch.softmax(t, 1).numpy()))(torch.from_numpy(data)) if torch else None
    return (lambda: F.softmax(x, dim=1).numpy()), theirs, "ms", None


def _matmul(n):
    def workload(torch):
        a, b = _data(n, n), _data(n, n, seed=1)
        ma, mb = mg.tensor(a), mg.tensor(b)
        theirs = None
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            theirs = lambda: (ta @ tb).numpy()  # noqa: E731
        return (lambda: (ma @ mb).numpy()), theirs, "GFLOP/s", 2 * n ** 3
    return workload


def w4(torch):
    x, w = _data(8, 64, 56, 56), _data(64, 64, 3, 3, seed=1)
    mx, mw = mg.tensor(x), mg.tensor(w)
    theirs = None
    if torch:
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        theirs = lambda: torch.nn.functional.conv2d(tx, tw, padding=1).numpy()  # noqa: E731
    return (lambda: F.conv2d(mx, mw, padding=1).numpy()), theirs, "GFLOP/s", 2 * 8 * 64 * 56 * 56 * 64 * 9


def _torch_resnet18(torch, num_classes):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, inp, out, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)
            self.conv2, self.bn2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out)
            self.downsample = None if stride == 1 and inp == out else nn.Sequential(
                nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))
    layers, channels = [], 64
    for width, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [Block(channels, width, stride), Block(width, width, 1)]
        channels = width
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, num_classes))


def _torch_vgg11(torch):
    nn, layers, channels = torch.nn, [], 3
    for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
        layers += [nn.MaxPool2d(2)] if v == "M" else [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU()]
        channels = v if v != "M" else channels
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(),
                         nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 1000))


def _inference(make_ours, make_theirs, batch):
    def workload(torch):
        data = _data(batch, 3, 224, 224)
        model, x = make_ours().eval(), mg.tensor(data)

        def ours():
            with mg.no_grad():
                return model(x).numpy()
        theirs = None
        if torch:
            reference, t = make_theirs(torch).eval(), torch.from_numpy(data)

            def theirs():
                with torch.no_grad():
                    return reference(t).numpy()
        return ours, theirs, "images/s", batch
    return workload


def w6(torch):
    data, labels = _data(32, 3, 32, 32), np.random.default_rng(0).integers(0, 10, 32)
    model = mg.models.resnet18(num_classes=10)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = mg.tensor(data), mg.tensor(labels)

    def ours():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    theirs = None
    if torch:
        reference = _torch_resnet18(torch, 10)
        torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
        tx, ty = torch.from_numpy(data), torch.from_numpy(labels)

        def theirs():
            loss = torch.nn.functional.cross_entropy(reference(tx), ty)
            torch_optimizer.zero_grad()
            loss.backward()
            torch_optimizer.step()
            return loss.item()
    return ours, theirs, "images/s", 32


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
    "W3a": ("matmul 1024^3", _matmul(1024)),
    "W3b": ("matmul 256^3", _matmul(256)),
    "W4": ("conv2d 3x3, (8,64,56,56) -> 64", w4),
    "W5": ("ResNet-18 inference, batch 8, 224^2", _inference(mg.models.resnet18,
                                                           lambda torch: _torch_resnet18(torch, 1000), 8)),
    "W6": ("ResNet-18 training step, batch 32, 32^2", w6),
    "W7": ("1000 x (a + 1) on 16 floats, then read", w7),
    "W9": ("VGG-11 inference, batch 4, 224^2", _inference(mg.models.vgg11, _torch_vgg11, 4)),
    **transformer_workloads,
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
        environment = dict(os.environ, METAGRAPH_CACHE_DIR=cache)
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
    "M512": ("matmul 512^3", _matmul(512)),
}


def compare_backends(repeat, json_path):
    """The same workloads on every code generator that works here, in one run; ratio = c time /
    backend time (above 1: faster than c)."""
    names = []
    for name in ("c", "llvm", "bang"):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated workload ids (W1..W12)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="bench.json")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-start measurement")
    parser.add_argument("--library", action="store_true",
                        help="run einsum-like contractions through numpy's BLAS (METAGRAPH_LIBRARY=1)")
    parser.add_argument("--backends", action="store_true",
                        help="compare the code generators (c, llvm, bang) instead of PyTorch")
    args = parser.parse_args(argv)
    if args.backends:
        compare_backends(args.repeat, args.json)
        return
    chosen = set(args.only.split(",")) if args.only else set(WORKLOADS) | {"W8"}
    torch = _torch()
    mg.flags.LIBRARY = 1 if args.library else mg.flags.LIBRARY
    print(f"metagraph {mg.get_backend()} backend, {mg.flags.NUM_THREADS} threads, "
          f"contractions {'through the BLAS numpy links' if mg.flags.LIBRARY else 'generated'}; "
          f"PyTorch {torch.__version__ if torch else 'not installed'}", flush=True)
    rows = []
    for key, (title, make) in WORKLOADS.items():
        if key not in chosen:
            continue
        ours, theirs, unit, work = make(torch)
        mine, *other = median_seconds([ours] + ([theirs] if theirs is not None else []), args.repeat)
        row = {"id": key, "workload": title, "unit": unit, "metagraph": _figure(unit, work, mine)}
        if theirs is not None:
            row["pytorch"] = _figure(unit, work, other[0])
            row["ratio"] = other[0] / mine
        rows.append(row)
        print(_format(row), flush=True)
    if "W8" in chosen:
        seconds, accuracy = digits_time_to_95()
        row = {"id": "W8", "workload": "digits MLP, seconds to 95% test accuracy", "unit": "s",
               "metagraph": seconds, "final_accuracy": accuracy}
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
    if "final_accuracy" in row:
        text += f"  final accuracy {row['final_accuracy']:.3f}"
    return text


if __name__ == "__main__":
    main()
