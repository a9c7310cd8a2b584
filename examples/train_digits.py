"""Train a small CNN (or, with --mlp, a 64-128-10 MLP) on scikit-learn's bundled 8x8 digits.

    python examples/train_digits.py            # CNN, ends at about 98% test accuracy
    python examples/train_digits.py --mlp      # MLP, about 96-97%
    mpirun -n 2 python examples/train_digits.py --distributed    # data-parallel on 2 processes (DDP)
    python examples/train_digits.py --amp      # bfloat16 autocast (--amp float16 scales the loss)

Written as a PyTorch user would: nn.Module, DataLoader, CrossEntropyLoss, Adam."""
import argparse
import time

import metagraph as mg
from metagraph import nn


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def accuracy(model, loader, amp=None):
    model.eval()
    correct = total = 0
    with mg.no_grad(), amp or mg.autocast(enabled=False):
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum().item())
            total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlp", action="store_true", help="train the MLP instead of the CNN")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distributed", action="store_true",
                        help="train on the ranks mpirun starts: DistributedDataParallel, a "
                             "DistributedSampler share of each epoch and batch-size / ranks images per "
                             "rank; rank 0 prints")
    parser.add_argument("--save", metavar="PATH", help="write the trained model's state_dict there (rank 0)")
    parser.add_argument("--amp", nargs="?", const="bfloat16", choices=["bfloat16", "float16"],
                        help="mixed precision: convolutions and linear layers in bfloat16 (or float16, with "
                             "dynamic loss scaling) under mg.autocast; parameters and the loss stay float32")
    parser.add_argument("--plot", metavar="PATH", help="draw the loss and accuracy curves to this PNG "
                                                       "(needs matplotlib: the examples extra)")
    args = parser.parse_args()
    if args.plot:
        try:
            mg.viz.require_matplotlib()     # before training, not after it
        except mg.MetagraphError as error:
            parser.error(str(error))
    history = {"loss": {"train": []}, "accuracy": {"test": []}}
    epochs = args.epochs or (30 if args.mlp else 15)
    lr = args.lr or (1e-3 if args.mlp else 2e-3)

    mg.manual_seed(args.seed)
    ranks, main_rank = (mg.world_size, mg.rank == 0) if args.distributed else (1, True)
    digits = mg.datasets.digits(train=True, seed=args.seed)
    sampler = mg.data.DistributedSampler(digits, seed=args.seed) if args.distributed else None
    train = mg.data.DataLoader(digits, batch_size=max(1, args.batch_size // ranks), shuffle=sampler is None,
                               sampler=sampler, progress=main_rank)
    test = mg.data.DataLoader(mg.datasets.digits(train=False, seed=args.seed), batch_size=256)
    model = mlp() if args.mlp else DigitsCNN()
    if args.distributed:        # every rank starts from rank 0's weights; backward averages the gradients
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = mg.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    amp = mg.autocast(dtype=args.amp or "bfloat16", enabled=bool(args.amp))
    scaler = mg.amp.GradScaler(enabled=args.amp == "float16")     # float16 gradients underflow unscaled
    log = print if main_rank else (lambda *args: None)
    log(f"metagraph {mg.get_backend()} backend; {'MLP' if args.mlp else 'CNN'}, "
        f"{sum(p.numel() for p in model.parameters())} parameters"
        + (f"; {ranks} ranks" if args.distributed else "") + (f"; autocast {args.amp}" if args.amp else ""))
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)        # a new order each epoch, the same on every rank
        total, count = 0.0, 0
        for x, y in train:
            with amp:
                loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total += loss.item() * len(y)
            count += len(y)
        if args.distributed:                # the loss over every rank's samples
            sums = mg.tensor([total, count], dtype=mg.float64)
            mg.distributed.all_reduce(sums)
            total, count = sums.tolist()
        score = accuracy(model, test, amp)
        history["loss"]["train"].append((epoch, total / count))
        history["accuracy"]["test"].append((epoch, score))
        log(f"epoch {epoch:2d}  loss {total / count:.4f}  test accuracy {score:.4f}  "
            f"({time.perf_counter() - start:.1f} s)")
    log(f"final test accuracy: {accuracy(model, test, amp):.4f}")
    if args.save and main_rank:
        mg.save((model.module if args.distributed else model).state_dict(), args.save)
        log(f"saved {args.save}")
    if args.plot and main_rank:
        drawn = mg.viz.curves(args.plot, history, title=f"{'MLP' if args.mlp else 'CNN'} on digits")
        log(f"curves drawn to {drawn}")


if __name__ == "__main__":
    main()
