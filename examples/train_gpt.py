"""Train a small character-level GPT on the Python standard library's own source code, then sample.

    python examples/train_gpt.py                       # 4 layers, d_model 128, 4 heads, context 128
    python examples/train_gpt.py --epochs 2 --sample "def "
    python examples/train_gpt.py --amp                 # matmuls in bfloat16 under mg.autocast

The text is every .py file of the interpreter's Lib/ directory (a few MB that ship with every
Python install), read as bytes (a vocabulary of 256 characters); files are split into training and
validation by a fixed seed. Written as a PyTorch user would: nn.Module, AdamW, cross_entropy."""
import argparse
import glob
import os
import sysconfig
import time

import numpy as np
from tqdm import tqdm

import metagraph as mg
import metagraph.nn.functional as F


def stdlib_text(seed, validation_fraction=0.1):
    """(training bytes, validation bytes): the standard library's .py files, split by file."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    order = np.random.default_rng(seed).permutation(len(files))
    cut = max(1, int(len(files) * validation_fraction))
    read = [open(files[k], "rb").read() for k in order]
    return np.frombuffer(b"".join(read[cut:]), np.uint8), np.frombuffer(b"".join(read[:cut]), np.uint8)


def windows(data, starts, context):
    """(inputs, targets) for windows of `context` bytes starting at `starts`."""
    rows = starts[:, None] + np.arange(context + 1)
    chunk = data[rows].astype(np.int64)
    return mg.tensor(chunk[:, :-1]), mg.tensor(chunk[:, 1:])


def loss_of(model, x, y, amp=None):
    with amp or mg.autocast(enabled=False):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def evaluate(model, data, context, batch_size, batches, seed, amp=None):
    """Mean validation loss (nats per byte) over fixed windows."""
    rng = np.random.default_rng(seed)
    model.eval()
    total = 0.0
    with mg.no_grad():
        for _ in range(batches):
            starts = rng.integers(0, len(data) - context - 1, batch_size)
            total += loss_of(model, *windows(data, starts, context), amp).item()
    model.train()
    return total / batches


def sample(model, prompt, length, context, temperature, seed):
    """Continue `prompt` by `length` bytes, drawing each from the model's softmax."""
    rng = np.random.default_rng(seed)
    out = list(prompt.encode())
    model.eval()
    with mg.no_grad():
        for _ in range(length):
            # one window of `context` bytes, the text at its start: the model is causal, so what
            # follows the text changes nothing, and every step reuses the same kernels
            window = out[-context:]
            idx = np.zeros((1, context), dtype=np.int64)
            idx[0, :len(window)] = window
            logits = model(mg.tensor(idx))[0, len(window) - 1].numpy().astype(np.float64) / temperature
            p = np.exp(logits - logits.max())
            out.append(int(rng.choice(256, p=p / p.sum())))
    model.train()
    return bytes(out).decode("utf-8", errors="replace")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=200)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default="gpt.ckpt", help="where the weights are saved")
    parser.add_argument("--sample", default="def ", help="prompt to continue after training")
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--amp", nargs="?", const="bfloat16", choices=["bfloat16", "float16"],
                        help="mixed precision: matmuls and attention in bfloat16 (or float16, with dynamic "
                             "loss scaling) under mg.autocast; weights, softmax sums and the loss in float32")
    parser.add_argument("--plot", metavar="PATH", help="draw the training and validation loss curves to "
                                                       "this PNG (needs matplotlib: the examples extra)")
    args = parser.parse_args()

    mg.manual_seed(args.seed)
    train, validation = stdlib_text(args.seed)
    counts = np.bincount(train, minlength=256) + 1
    frequencies = np.bincount(validation, minlength=256)
    unigram = -np.sum(frequencies * np.log(counts / counts.sum())) / len(validation)
    model = mg.models.gpt(256, args.context, args.d_model, args.heads, args.layers)
    optimizer = mg.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = mg.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs * args.steps_per_epoch)
    amp = mg.autocast(dtype=args.amp or "bfloat16", enabled=bool(args.amp))
    scaler = mg.amp.GradScaler(enabled=args.amp == "float16")     # float16 gradients underflow unscaled
    print(f"metagraph {mg.get_backend()} backend; {len(train) / 1e6:.1f} MB of training text, "
          f"{len(validation) / 1e6:.2f} MB validation; {sum(p.numel() for p in model.parameters())} "
          f"parameters; unigram baseline {unigram:.3f} nats/byte")
    if args.plot:
        try:
            mg.viz.require_matplotlib()     # before training, not after it
        except mg.MetagraphError as error:
            parser.error(str(error))
    curves = {"train": [], "validation": []}
    rng, tokens = np.random.default_rng(args.seed + 1), args.batch_size * args.context
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        bar = tqdm(range(args.steps_per_epoch), desc=f"epoch {epoch}", unit="step")
        for step in bar:
            tick = time.perf_counter()
            starts = rng.integers(0, len(train) - args.context - 1, args.batch_size)
            loss = loss_of(model, *windows(train, starts, args.context), amp)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            curves["train"].append(((epoch - 1) * args.steps_per_epoch + step + 1, loss.item()))
            bar.set_postfix(loss=f"{curves['train'][-1][1]:.3f}",
                            tokens_per_s=f"{tokens / (time.perf_counter() - tick):.0f}")
        score = evaluate(model, validation, args.context, args.batch_size, args.eval_batches, args.seed, amp)
        curves["validation"].append((epoch * args.steps_per_epoch, score))
        print(f"epoch {epoch}: validation loss {score:.3f} nats/byte (unigram {unigram:.3f}), "
              f"{time.perf_counter() - start:.0f} s")
    if args.plot:
        curves["unigram baseline"] = [(1, unigram), (args.epochs * args.steps_per_epoch, unigram)]
        drawn = mg.viz.curves(args.plot, {"loss (nats/byte)": curves}, "step", "GPT on the standard library")
        print(f"curves drawn to {drawn}")
    mg.save(model.state_dict(), args.checkpoint)
    print(f"saved {args.checkpoint}\n--- sample ---")
    print(sample(model, args.sample, args.sample_length, args.context, args.temperature, args.seed))


if __name__ == "__main__":
    main()
