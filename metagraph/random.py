"""The random-number generator behind rand, randn, randint and dropout (reproducible by seed)."""
import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed):
    """Reset the generator so that later random tensors repeat."""
    global _generator
    _generator = np.random.default_rng(int(seed))


def generator():
    return _generator
