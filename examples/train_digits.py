"""Train a small CNN (or, with --mlp, a 64-128-10 MLP) on scikit-learn's bundled 8x8 digits.

    python examples/train_digits.py            # CNN, ends at about 98% test accuracy
    python examples/train_digits.py --mlp      # MLP, about 96-97%

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


def accuracy(model, loader):
    model.eval()
    correct = total = 0
    with mg.no_grad():
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
    args = parser.parse_args()
    epochs = args.epochs or (30 if args.mlp else 15)
    lr = args.lr or (1e-3 if args.mlp else 2e-3)

    mg.manual_seed(args.seed)
    train = mg.data.DataLoader(mg.datasets.digits(train=True, seed=args.seed), batch_size=args.batch_size,
                               shuffle=True, progress=True)
    test = mg.data.DataLoader(mg.datasets.digits(train=False, seed=args.seed), batch_size=256)
    model = mlp() if args.mlp else DigitsCNN()
    optimizer = mg.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    print(f"metagraph {mg.get_backend()} backend; {'MLP' if args.mlp else 'CNN'}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        total, count = 0.0, 0
        for x, y in train:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
        print(f"epoch {epoch:2d}  loss {total / count:.4f}  test accuracy {accuracy(model, test):.4f}  "
              f"({time.perf_counter() - start:.1f} s)")
    print(f"final test accuracy: {accuracy(model, test):.4f}")


if __name__ == "__main__":
    main()
