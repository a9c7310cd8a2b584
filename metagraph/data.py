"""Datasets and a DataLoader, as torch.utils.data (batches are assembled on the host)."""
import numpy as np

from metagraph import creation
from metagraph.errors import ArgumentError
from metagraph.tensor import Tensor


class Dataset:
    """Anything with __getitem__ and __len__."""

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class TensorDataset(Dataset):
    """Samples are the index-th rows of equally long tensors or arrays."""

    def __init__(self, *tensors):
        arrays = [t.numpy() if isinstance(t, Tensor) else np.asarray(t) for t in tensors]
        if not arrays or any(len(a) != len(arrays[0]) for a in arrays):
            raise ArgumentError(f"TensorDataset: tensors of different lengths {[len(a) for a in arrays]}")
        self.arrays = arrays

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


def default_collate(samples):
    """Stack a list of samples (tuples of arrays or numbers) into a tuple of Tensors."""
    first = samples[0]
    if isinstance(first, tuple):
        return tuple(default_collate([s[k] for s in samples]) for k in range(len(first)))
    return creation.tensor(np.stack([np.asarray(s) for s in samples]))


class DataLoader:
    """Batches of a dataset: batch_size, shuffle (seeded), drop_last, an optional progress bar."""

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, seed=None, progress=False,
                 collate_fn=None):
        if batch_size < 1:
            raise ArgumentError(f"DataLoader: batch_size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self.generator = np.random.default_rng(seed)
        self.progress, self.collate_fn = progress, collate_fn or default_collate

    def __len__(self):
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _batches(self):
        count = len(self.dataset)
        order = self.generator.permutation(count) if self.shuffle else np.arange(count)
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            if len(index) < self.batch_size and self.drop_last:
                return
            if isinstance(self.dataset, TensorDataset) and self.collate_fn is default_collate:
                yield tuple(creation.tensor(a[index]) for a in self.dataset.arrays)   # one gather, no loop
            else:
                yield self.collate_fn([self.dataset[int(i)] for i in index])

    def __iter__(self):
        if not self.progress:
            return self._batches()
        from tqdm import tqdm
        return iter(tqdm(self._batches(), total=len(self), leave=False,
                         desc=self.progress if isinstance(self.progress, str) else None))
