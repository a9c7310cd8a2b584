"""Run a zoo model on random input or a .npy batch and print images/s and the top-5 classes.

    python examples/resnet_inference.py --model resnet18 --batch 8
    python examples/resnet_inference.py --weights resnet18.pth --input images.npy   # torchvision weights
"""
import argparse
import time

import numpy as np

import metagraph as mg


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--weights", help="a .pth state dict (e.g. torchvision's), loaded without PyTorch")
    parser.add_argument("--input", help="a .npy float array of shape (N, 3, H, W), already normalised")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    model = getattr(mg.models, args.model)()
    if args.weights:
        model.load_state_dict(mg.load(args.weights))
    model.eval()
    batch = np.load(args.input).astype(np.float32) if args.input else \
        np.random.default_rng(0).standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    x = mg.tensor(batch)
    with mg.no_grad():
        start = time.perf_counter()
        logits = model(x).numpy()
        first = time.perf_counter() - start
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            logits = model(x).numpy()
            times.append(time.perf_counter() - start)
    steady = sorted(times)[len(times) // 2]
    print(f"{args.model} on {mg.get_backend()}: first call {first:.2f} s (includes compiling), "
          f"steady {len(batch) / steady:.1f} images/s (batch {len(batch)})")
    for row, scores in enumerate(logits[:4]):
        top = np.argsort(scores)[::-1][:5]
        print(f"image {row}: top-5 classes {top.tolist()}")


if __name__ == "__main__":
    main()
