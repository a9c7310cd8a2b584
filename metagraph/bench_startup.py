"""Rows S1-S5: what a user waits for before training runs and what it holds while it does.

ResNet-18 training (SGD with momentum, batch 32, 32^2), each framework in a fresh process so that
start-up and peak memory are its own: S1 the first step with a warm kernel cache (a restarted
script), S2 with an empty one (metagraph only), S3 the peak resident memory above the import over
ten steps, S4 the Python per step (a step's median time less its kernels', from `mg.profile()`).
S5: a small CNN's inference over batch sizes 1..200 in one process with an empty kernel cache: the
kernels compiled after the first size (compiler/generic.py), the resident memory at the end above
the import, beside PyTorch's, and how flat it stays: the whole process's resident memory at the
end over that of a process that ran size 200 alone (1.0: the 199 other sizes left nothing behind).
"""
import json
import os
import subprocess
import sys
import tempfile

PRELUDE = """
import json, sys, time
import numpy as np
framework, threads = sys.argv[1], int(sys.argv[2])

def status_mib(field):
    # from /proc: VmHWM is this address space's peak (ru_maxrss starts at the parent's size after
    # a fork), VmRSS what it holds now
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024
"""

PROGRAM = PRELUDE + """
def peak_mib():
    return status_mib("VmHWM")

if framework == "metagraph":
    import metagraph as mg
    import metagraph.nn.functional as F
    base = peak_mib()
    model = mg.models.resnet18(num_classes=10)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = mg.tensor(np.random.default_rng(0).random((32, 3, 32, 32), np.float32))
    y = mg.tensor(np.random.default_rng(1).integers(0, 10, 32))
    loss_of = lambda: F.cross_entropy(model(x), y)
else:
    import torch
    import torch.nn.functional as F
    from metagraph.bench_zoo import torch_resnet
    torch.set_num_threads(threads)
    base = peak_mib()
    model = torch_resnet(torch, [2, 2, 2, 2], num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.from_numpy(np.random.default_rng(0).random((32, 3, 32, 32), np.float32))
    y = torch.from_numpy(np.random.default_rng(1).integers(0, 10, 32))
    loss_of = lambda: F.cross_entropy(model(x), y)

def step():
    start = time.perf_counter()
    loss = loss_of()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()
    return time.perf_counter() - start

def median(values):
    return sorted(values)[len(values) // 2]

first, second = step(), step()
steps, kernels = [step() for _ in range(5)], []
for _ in range(3 if framework == "metagraph" else 0):    # (a profile's own cost is not the step's)
    with mg.profile() as prof:
        step()
    kernels.append(sum(kernel.seconds for kernel in prof.kernels))
print(json.dumps({"first": first, "second": second, "peak": peak_mib() - base,
                  "python": median(steps) - median(kernels) if kernels else None}))
"""

SIZES = PRELUDE + """
def rss_mib():
    return status_mib("VmRSS")

if framework == "metagraph":
    import metagraph as mg
    from metagraph import nn
    base, tensor, seed, no_grad = rss_mib(), mg.tensor, mg.manual_seed, mg.no_grad
else:
    import torch
    from torch import nn
    torch.set_num_threads(threads)
    base, tensor, seed, no_grad = rss_mib(), torch.from_numpy, torch.manual_seed, torch.no_grad
seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
compiles = []
for n in (range(1, 201) if sys.argv[3] == "all" else [int(sys.argv[3])]):
    x = tensor(np.random.default_rng(n).standard_normal((n, 1, 28, 28)).astype(np.float32))
    if framework == "metagraph":
        with mg.profile() as prof, no_grad():
            model(x).numpy()
        compiles.append(prof.compiles)
    else:
        with no_grad():
            model(x).numpy()
print(json.dumps({"compiles": sum(compiles[1:]), "rss": rss_mib() - base, "total": rss_mib()}))
"""


def _run(framework, threads, cache=None, program=PROGRAM, sizes="all"):
    environment = dict(os.environ, METAGRAPH_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if cache is not None:
        environment["METAGRAPH_CACHE_DIR"] = cache
    done = subprocess.run([sys.executable, "-c", program, framework, str(threads), sizes], env=environment,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {framework} start-up program failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(threads, torch_installed, cold=True):
    """The rows S1-S5 as bench.py prints them."""
    _run("metagraph", threads)                       # fills the cache the next process finds warm
    ours = _run("metagraph", threads)
    theirs = _run("torch", threads) if torch_installed else None
    found = [_row("S1", "ResNet-18 training, first step, fresh process, warm cache", "s",
                  ours["first"], theirs and theirs["first"], lower_is_better=True),
             _row("S3", "ResNet-18 training, peak RSS above the import", "MiB",
                  ours["peak"], theirs and theirs["peak"], lower_is_better=True),
             _row("S4", "ResNet-18 training, Python per step (step less kernels)", "ms",
                  ours["python"] * 1e3, None, lower_is_better=True)]
    if cold:
        with tempfile.TemporaryDirectory() as cache:
            found.insert(1, _row("S2", "ResNet-18 training, first step, fresh process, empty cache", "s",
                                 _run("metagraph", threads, cache)["first"], None, lower_is_better=True))
            sizes = _run("metagraph", threads, tempfile.mkdtemp(dir=cache), SIZES)
            alone = _run("metagraph", threads, tempfile.mkdtemp(dir=cache), SIZES, sizes="200")
        theirs = _run("torch", threads, program=SIZES) if torch_installed else None
        theirs_alone = _run("torch", threads, program=SIZES, sizes="200") if torch_installed else None
        found += [_row("S5", "small CNN inference, batch sizes 1..200: kernels compiled after the first",
                       "kernels", sizes["compiles"], None, lower_is_better=True),
                  _row("S5m", "... resident memory at the end, above the import", "MiB", sizes["rss"],
                       theirs and theirs["rss"], lower_is_better=True),
                  _row("S5f", "... whole process's memory at the end / size 200 alone's", "x",
                       sizes["total"] / alone["total"], theirs and theirs["total"] / theirs_alone["total"],
                       lower_is_better=True)]
    return found


def _row(key, title, unit, mine, pytorch, lower_is_better):
    row = {"id": key, "workload": title, "unit": unit, "metagraph": mine}
    if pytorch is not None:
        row["pytorch"] = pytorch
        row["ratio"] = pytorch / mine if lower_is_better else mine / pytorch
    return row
