"""DistributedSampler: each rank's share of a dataset's indices, as torch.utils.data's.

Every rank draws the same permutation (from `seed + epoch`: call set_epoch(epoch) at the start of
each epoch to get a new one), pads it by repeating its start until it divides evenly among the
ranks (or, with drop_last, cuts its tail), and takes every num_replicas-th index from its rank on:
the ranks' shares are disjoint (but for the padding) and equally long, so they run the same number
of steps. The permutation is numpy's (an mg.Generator seeded with seed + epoch), not PyTorch's
generator, so a shuffled order differs from torch's for the same seed; the split is the same.
"""
import math

import numpy as np

from metagraph.errors import ArgumentError
from metagraph.random import Generator


class DistributedSampler:
    """Indices of `dataset` for rank `rank` of `num_replicas` (by default the process group's rank and
    world size: metagraph.distributed)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            from metagraph import distributed
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if not _is_integer(num_replicas) or num_replicas < 1:
            raise ArgumentError(f"DistributedSampler: num_replicas must be a positive integer, got "
                                f"{num_replicas!r}")
        if not _is_integer(rank) or not 0 <= rank < num_replicas:
            raise ArgumentError(f"DistributedSampler: invalid rank {rank!r}; rank should be in the interval "
                                f"[0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, int(seed), drop_last, 0
        length = len(dataset)
        if drop_last and length % self.num_replicas:
            self.num_samples = math.ceil((length - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(length / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        length = len(self.dataset)
        if self.shuffle:
            order = Generator().manual_seed(self.seed + self.epoch).numpy.permutation(length)
        else:
            order = np.arange(length)
        # Repeating the order cyclically pads it (drop_last: total_size <= length cuts it instead).
        order = np.resize(order, self.total_size) if length else order[:0]
        return iter(order[self.rank:self.total_size:self.num_replicas].tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Draw the permutation of `epoch` (the same on every rank) at the next iteration."""
        self.epoch = int(epoch)


def _is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
