"""Small data sets that need no download."""
import numpy as np

from metagraph.data import TensorDataset


def digits(train=True, test_fraction=0.2, seed=0):
    """scikit-learn's bundled 8x8 digits (1797 images) as (images (N, 1, 8, 8) in [0, 1], labels).

    The split is a fixed shuffle by `seed`; train=None returns everything."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("metagraph.datasets.digits needs scikit-learn: pip install 'metagraph[examples]'") \
            from None
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(round(len(images) * (1 - test_fraction)))
    chosen = order
    if train is not None:
        chosen = order[:cut] if train else order[cut:]
    return TensorDataset(images[chosen], labels[chosen])
