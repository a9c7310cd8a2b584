"""Train a small MLP on scikit-learn's bundled 8x8 digits and print the test accuracy.

Written with metagraph's functional API: parameters are leaf tensors, gradients come from
mg.grad, and the Adam update runs under no_grad.
"""
import argparse
import math
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import metagraph as mg
import metagraph.nn.functional as F


def load(seed):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.8 * len(x))
    return x[order[:split]], digits.target[order[:split]], x[order[split:]], digits.target[order[split:]]


def init_linear(fan_in, fan_out):
    bound = 1 / math.sqrt(fan_in)           # PyTorch's default initialisation for Linear
    return (mg.rand(fan_out, fan_in) * (2 * bound) - bound).requires_grad_(), \
        (mg.rand(fan_out) * (2 * bound) - bound).requires_grad_()


def forward(params, x):
    w1, b1, w2, b2 = params
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    mg.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load(args.seed)
    params = [*init_linear(64, 128), *init_linear(128, 10)]
    moments = [(mg.zeros_like(p), mg.zeros_like(p)) for p in params]
    beta1, beta2, eps, step = 0.9, 0.999, 1e-8, 0
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    print(f"metagraph backend: {mg.get_backend()}")
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        batches = range(0, len(order), args.batch_size)
        total = 0.0
        for first in tqdm(batches, desc=f"epoch {epoch}", leave=False):
            index = order[first:first + args.batch_size]
            loss = F.cross_entropy(forward(params, mg.tensor(x_train[index])), mg.tensor(y_train[index]))
            grads = mg.grad(loss, params)
            step += 1
            with mg.no_grad():
                for p, g, (m, v) in zip(params, grads, moments):
                    m.assign(m * beta1 + g * (1 - beta1))
                    v.assign(v * beta2 + g * g * (1 - beta2))
                    m_hat = m / (1 - beta1 ** step)
                    v_hat = v / (1 - beta2 ** step)
                    p -= m_hat / (v_hat.sqrt() + eps) * args.lr
            mg.sync(loss, *params, *[t for pair in moments for t in pair])
            total += loss.item() * len(index)
        with mg.no_grad():
            predicted = forward(params, mg.tensor(x_test)).argmax(1).numpy()
        accuracy = float((predicted == y_test).mean())
        print(f"epoch {epoch:2d}  loss {total / len(x_train):.4f}  test accuracy {accuracy:.4f}  "
              f"({time.perf_counter() - start:.1f} s)")
    print(f"final test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
