"""Timing helpers shared by the benchmarks: warm up, then the median of several forced runs."""
import statistics
import time


def median_seconds(fn, repeat=7, warmup=2):
    """Median wall time of fn() (which must force its result) after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_or_none(threads=2):
    """PyTorch if it is installed (set to `threads` threads), else None."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def table(rows, columns):
    """Rows of dicts as an aligned text table."""
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(lines)
