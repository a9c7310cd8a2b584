"""Mixed-precision benchmark rows: bfloat16 autocast against float32 and against PyTorch's CPU
autocast, in the same run (`python -m metagraph.bench --amp`, or `python -m metagraph.bench_amp`).

A1a, A1b  matmul 1024^3 and 2048^3 of float32 operands under autocast (each call casts them, as
          PyTorch's autocast does), against float32; GFLOP/s.
A1c       matmul 2048^3 of bfloat16 operands: the contraction itself (the AVX-512 BF16 kernel where
          the CPU has it), against our float32 matmul; GFLOP/s.
A2        conv2d 3x3, (8, 64, 56, 56) -> 64 under autocast; GFLOP/s.
A3a, A3b  ResNet-18 training step, SGD with momentum, forward and loss under autocast: batch 32 of
          32^2 images (W6's step, where weights, their gradients and the momentum outweigh the
          activations) and batch 8 of 224^2 (where the activations dominate); images/s, the peak
          of the memory the step's kernels allocate (mg.profile), and the peak resident memory
          above the import of a fresh process training STEPS_IN_FRESH_PROCESS steps (VmHWM, as
          row S3 measures it; the kernels are in the disk cache by then, and the step that times
          tuning variants, which keeps their inputs, is among them unless METAGRAPH_TUNE=0).
Each figure is a median of calls timed in alternation with the others of its row (metagraph.bench's
median_seconds): a noisy neighbour slows all of them alike. bf16/f32 is metagraph's bfloat16
figure over its float32 one; vs torch, metagraph's bfloat16 figure over PyTorch's autocast one.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.bench import _torch, median_seconds, set_threads
from metagraph.bench_kernels import random_array
from metagraph.bench_transformer import training_step
from metagraph.bench_zoo import twin


def _autocast(torch):
    return torch.autocast("cpu", dtype=torch.bfloat16)


def matmul(n, operands="float32"):
    """(fns by name, unit, work): n^3 matmul under autocast (or of bfloat16 operands) and in float32."""
    def workload(torch):
        a, b = random_array(n, n), random_array(n, n, seed=1)
        ma, mb = mg.tensor(a), mg.tensor(b)
        low_a, low_b = (ma.bfloat16(), mb.bfloat16()) if operands == "bfloat16" else (ma, mb)
        mg.sync(low_a, low_b)

        def ours_bf16():
            with mg.autocast(dtype=mg.bfloat16):
                return (low_a @ low_b).numpy()
        fns = {"metagraph_bf16": ours_bf16, "metagraph_f32": lambda: (ma @ mb).numpy()}
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            low_ta, low_tb = (ta.bfloat16(), tb.bfloat16()) if operands == "bfloat16" else (ta, tb)

            def theirs_bf16():
                with _autocast(torch):
                    return (low_ta @ low_tb).float().numpy()
            fns.update(pytorch_bf16=theirs_bf16, pytorch_f32=lambda: (ta @ tb).numpy())
        return fns, "GFLOP/s", 2 * n ** 3
    return workload


def conv3x3(torch):
    """(fns by name, unit, work): a 3x3 conv under autocast and in float32."""
    x, w = random_array(8, 64, 56, 56), random_array(64, 64, 3, 3, seed=1)
    mx, mw = mg.tensor(x), mg.tensor(w)

    def ours_bf16():
        with mg.autocast(dtype=mg.bfloat16):
            return F.conv2d(mx, mw, padding=1).numpy()
    fns = {"metagraph_bf16": ours_bf16, "metagraph_f32": lambda: F.conv2d(mx, mw, padding=1).numpy()}
    if torch:
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)

        def theirs_bf16():
            with _autocast(torch):
                return torch.nn.functional.conv2d(tx, tw, padding=1).float().numpy()
        fns.update(pytorch_bf16=theirs_bf16,
                   pytorch_f32=lambda: torch.nn.functional.conv2d(tx, tw, padding=1).numpy())
    return fns, "GFLOP/s", 2 * 8 * 64 * 56 * 56 * 64 * 9


def resnet18_training(batch, size):
    """(fns by name, unit, work): a ResNet-18 training step under autocast and in float32."""
    return lambda torch: _resnet18_training(torch, batch, size)


def _resnet18_training(torch, batch, size):
    data, labels = random_array(batch, 3, size, size), np.random.default_rng(0).integers(0, 10, batch)
    x, y = mg.tensor(data), mg.tensor(labels)
    fns = {}
    for name, enabled in (("metagraph_bf16", True), ("metagraph_f32", False)):
        model = mg.models.resnet18(num_classes=10)
        amp = mg.autocast(dtype=mg.bfloat16, enabled=enabled)

        def loss(model=model, amp=amp):
            with amp:
                return F.cross_entropy(model(x), y)
        fns[name] = training_step(loss, mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    if torch:
        tx, ty = torch.from_numpy(data), torch.from_numpy(labels)
        for name, enabled in (("pytorch_bf16", True), ("pytorch_f32", False)):
            reference = twin(torch, "resnet18", mg.models.resnet18(num_classes=10), num_classes=10).train()

            def loss(reference=reference, enabled=enabled):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                    return torch.nn.functional.cross_entropy(reference(tx), ty)
            fns[name] = training_step(loss, torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9))
    return fns, "images/s", batch


SHAPES = {"A3a": (32, 32), "A3b": (8, 224)}      # the training rows' batch and image size
WORKLOADS = {
    "A1a": ("matmul 1024^3, float32 operands, under autocast", matmul(1024)),
    "A1b": ("matmul 2048^3, float32 operands, under autocast", matmul(2048)),
    "A1c": ("matmul 2048^3, bfloat16 operands", matmul(2048, "bfloat16")),
    "A2": ("conv2d 3x3, (8,64,56,56) -> 64, under autocast", conv3x3),
    "A3a": ("ResNet-18 training step, batch 32, 32^2, under autocast", resnet18_training(*SHAPES["A3a"])),
    "A3b": ("ResNet-18 training step, batch 8, 224^2, under autocast", resnet18_training(*SHAPES["A3b"])),
}


STEPS_IN_FRESH_PROCESS = 5
FRESH_PROCESS = """
import json, sys
import numpy as np
import metagraph as mg
import metagraph.nn.functional as F

def peak_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024

batch, size, enabled, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "bf16", int(sys.argv[4])
base = peak_mib()
model = mg.models.resnet18(num_classes=10)
optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
rng = np.random.default_rng(0)
x = mg.tensor(rng.standard_normal((batch, 3, size, size), np.float32))
y = mg.tensor(rng.integers(0, 10, batch))
for _ in range(steps):
    with mg.autocast(dtype=mg.bfloat16, enabled=enabled):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()
print(json.dumps(peak_mib() - base))
"""


def fresh_process_peak_mib(batch, size, precision):
    """The peak resident memory above the import, in MiB, of a new process training ResNet-18
    (`precision` "bf16": under autocast, "f32": without) for STEPS_IN_FRESH_PROCESS steps."""
    environment = dict(os.environ, METAGRAPH_NUM_THREADS=str(mg.flags.NUM_THREADS),
                       METAGRAPH_CACHE_DIR=mg.flags.CACHE_DIR)
    command = [sys.executable, "-c", FRESH_PROCESS, str(batch), str(size), precision,
               str(STEPS_IN_FRESH_PROCESS)]
    for _ in range(2):        # the first stores the schedules the second loads (as a restarted script would)
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"the fresh training process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_mib(step, calls=2):
    """The most memory the kernels of `step` hold at once (mg.profile's peak), in MiB."""
    step()
    with mg.profile() as report:
        for _ in range(calls):
            step()
    return report.peak_bytes / 2 ** 20


def measure(key, title, make, torch, repeat):
    """One row: each side's figure and the ratios (and the training step's peak memory)."""
    fns, unit, work = make(torch)
    seconds = median_seconds(list(fns.values()), repeat)
    row = {"id": key, "workload": title, "unit": unit}
    for name, value in zip(fns, seconds):
        row[name] = work / value / (1e9 if unit == "GFLOP/s" else 1)
    row["bf16_over_f32"] = row["metagraph_bf16"] / row["metagraph_f32"]
    if "pytorch_bf16" in row:
        row["vs_torch_bf16"] = row["metagraph_bf16"] / row["pytorch_bf16"]
    if key.startswith("A3"):
        row["peak_mib_bf16"] = peak_mib(fns["metagraph_bf16"])
        row["peak_mib_f32"] = peak_mib(fns["metagraph_f32"])
        batch, size = SHAPES[key]
        row["rss_mib_bf16"] = fresh_process_peak_mib(batch, size, "bf16")
        row["rss_mib_f32"] = fresh_process_peak_mib(batch, size, "f32")
    return row


def describe(row):
    """A row as one line of text."""
    text = f"{row['id']:<5} {row['workload']:<56} {row['unit']:<9}"
    for name in ("metagraph_bf16", "metagraph_f32", "pytorch_bf16", "pytorch_f32"):
        if name in row:
            text += f" {name.replace('metagraph', 'mg').replace('pytorch', 'pt')} {row[name]:8.3g}"
    text += f"  bf16/f32 {row['bf16_over_f32']:.2f}"
    if "vs_torch_bf16" in row:
        text += f"  vs torch bf16 {row['vs_torch_bf16']:.2f}"
    if "peak_mib_bf16" in row:
        text += f"  peak MiB bf16 {row['peak_mib_bf16']:.0f} f32 {row['peak_mib_f32']:.0f}"
    if "rss_mib_bf16" in row:
        text += f"  peak RSS MiB bf16 {row['rss_mib_bf16']:.0f} f32 {row['rss_mib_f32']:.0f}"
    return text


def rows(only=None, repeat=5):
    """The rows of the workloads named in `only` (all when None), printed as they are measured."""
    torch = _torch()
    print(f"metagraph {mg.get_backend()} backend, {mg.flags.NUM_THREADS} threads; PyTorch "
          f"{torch.__version__ if torch else 'not installed'}", flush=True)
    measured = []
    for key, (title, make) in WORKLOADS.items():
        if only is None or key in only:
            measured.append(measure(key, title, make, torch, repeat))
            print(describe(measured[-1]), flush=True)
    return measured


def main(argv=None):
    """The command line: the rows, printed and written to --json."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated ids ({', '.join(WORKLOADS)})")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, help="threads for metagraph and PyTorch")
    parser.add_argument("--json", default="bench_amp.json")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(WORKLOADS):
        parser.error(f"--only: no such workload {sorted(only - set(WORKLOADS))}; "
                     f"ids are {', '.join(WORKLOADS)}")
    measured = rows(only, args.repeat)
    with open(args.json, "w") as stream:
        json.dump(measured, stream, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
