"""Fusion against eager execution (workloads W1, W2, W7 of the benchmark brief).

    python benchmarks/fusion.py

Prints milliseconds per call for metagraph, NumPy and (when installed) PyTorch, measured in the
same run, and the ratios other / metagraph (above 1: metagraph is faster)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import median_seconds, table, torch_or_none  # noqa: E402

import metagraph as mg  # noqa: E402
import metagraph.nn.functional as F  # noqa: E402


def fused_elementwise(torch):
    data = np.random.default_rng(0).standard_normal(2 ** 24).astype(np.float32)
    x = mg.tensor(data)
    run = {"metagraph": lambda: (F.relu(x * 1.5 + 0.5) * F.sigmoid(x)).numpy(),
           "numpy": lambda: np.maximum(data * 1.5 + 0.5, 0) * (1 / (1 + np.exp(-data)))}
    if torch:
        t = torch.from_numpy(data)
        run["torch"] = lambda: (torch.relu(t * 1.5 + 0.5) * torch.sigmoid(t)).numpy()
    return "W1 relu(x*1.5+0.5)*sigmoid(x), 2^24", run, 2 ** 27


def softmax(torch):
    data = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)
    x = mg.tensor(data)

    def numpy_softmax():
        e = np.exp(data - data.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    run = {"metagraph": lambda: F.softmax(x, dim=1).numpy(), "numpy": numpy_softmax}
    if torch:
        t = torch.from_numpy(data)
        run["torch"] = lambda: torch.softmax(t, 1).numpy()
    return "W2 row softmax 4096x1024", run, None


def tiny_adds(torch):
    def chain(start, add):
        def go():
            a = start()
            for _ in range(1000):
                a = add(a)
            return a
        return go
    run = {"metagraph": lambda: chain(lambda: mg.zeros(16), lambda a: a + 1)().numpy(),
           "numpy": chain(lambda: np.zeros(16, np.float32), lambda a: a + 1)}
    if torch:
        run["torch"] = lambda: chain(lambda: torch.zeros(16), lambda a: a + 1)().numpy()
    return "W7 1000 x (a + 1) on 16 floats, then read", run, None


def main():
    torch = torch_or_none()
    rows = []
    for workload in (fused_elementwise, softmax, tiny_adds):
        name, run, nbytes = workload(torch)
        seconds = {k: median_seconds(fn) for k, fn in run.items()}
        row = {"workload": name, "metagraph ms": f"{seconds['metagraph'] * 1e3:.2f}",
               "numpy ms": f"{seconds['numpy'] * 1e3:.2f}",
               "numpy/metagraph": f"{seconds['numpy'] / seconds['metagraph']:.2f}"}
        if "torch" in seconds:
            row["torch ms"] = f"{seconds['torch'] * 1e3:.2f}"
            row["torch/metagraph"] = f"{seconds['torch'] / seconds['metagraph']:.2f}"
        if nbytes:
            row["metagraph GB/s"] = f"{nbytes / seconds['metagraph'] / 1e9:.1f}"
        if workload is tiny_adds:
            row["metagraph us/op"] = f"{seconds['metagraph'] * 1e3:.1f}"
        rows.append(row)
    print(f"backend {mg.get_backend()}, {mg.flags.NUM_THREADS} threads, torch "
          f"{torch.__version__ if torch else 'not installed'}")
    print(table(rows, ["workload", "metagraph ms", "numpy ms", "torch ms", "numpy/metagraph",
                       "torch/metagraph", "metagraph GB/s", "metagraph us/op"]))


if __name__ == "__main__":
    main()
