"""DistributedSampler against torch.utils.data.DistributedSampler's index lists. The permutation a
shuffled sampler draws is metagraph's generator's (numpy's), not torch's: the comparison hands torch
the same permutation (through torch.randperm) and checks everything done with it, the padding, the
cut of drop_last and each rank's share."""
import itertools

import numpy as np
import pytest

import metagraph as mg
from metagraph.utils.data import DistributedSampler

LENGTHS = (0, 1, 2, 5, 7, 10, 16, 17, 31)
REPLICAS = (1, 2, 3, 4, 7)


def permutation(seed, length):
    """The permutation metagraph's sampler draws for seed + epoch = seed."""
    return mg.Generator().manual_seed(seed).numpy.permutation(length)


@pytest.mark.parametrize("shuffle,drop_last", list(itertools.product((False, True), (False, True))))
def test_index_lists_equal_torchs(monkeypatch, shuffle, drop_last):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TorchSampler

    def randperm(n, generator=None, **kwargs):
        return torch.from_numpy(permutation(generator.initial_seed(), n))
    monkeypatch.setattr(torch, "randperm", randperm)
    for length, replicas, seed, epoch in itertools.product(LENGTHS, REPLICAS, (0, 42), (0, 3)):
        dataset = list(range(length))
        for rank in range(replicas):
            options = dict(shuffle=shuffle, seed=seed, drop_last=drop_last)
            ours = DistributedSampler(dataset, replicas, rank, **options)
            theirs = TorchSampler(dataset, replicas, rank, **options)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            case = f"n={length} replicas={replicas} rank={rank} seed={seed} epoch={epoch}"
            assert list(ours) == list(theirs), case
            assert len(ours) == len(theirs), case


@pytest.mark.parametrize("length,replicas", [(10, 3), (12, 4), (5, 7)])
def test_the_ranks_share_the_dataset(length, replicas):
    shares = [list(DistributedSampler(range(length), replicas, rank, seed=1)) for rank in range(replicas)]
    assert len({len(share) for share in shares}) == 1              # every rank runs as many steps
    together = sorted(itertools.chain(*shares))
    assert set(together) == set(range(length))                     # every sample is seen ...
    assert len(together) - length == -length % replicas            # ... once, but for the padding


def test_shuffle_follows_seed_and_epoch():
    first = DistributedSampler(range(50), 2, 0, seed=3)
    same = DistributedSampler(range(50), 2, 0, seed=3)
    assert list(first) == list(same) == list(first)                 # iterating again repeats the epoch
    first.set_epoch(1)
    assert list(first) != list(same)
    same.set_epoch(1)
    assert list(first) == list(same)
    assert list(DistributedSampler(range(50), 2, 0, seed=4)) == list(same)        # seed + epoch: 4
    assert list(DistributedSampler(range(50), 2, 0, seed=5)) != list(same)
    assert list(DistributedSampler(range(6), 2, 1, shuffle=False)) == [1, 3, 5]


def test_defaults_come_from_the_process_group():
    sampler = DistributedSampler(range(5), shuffle=False)
    assert (sampler.num_replicas, sampler.rank) == (mg.world_size, mg.rank) == (1, 0)
    assert list(sampler) == [0, 1, 2, 3, 4]


def test_a_dataloader_takes_it_as_its_sampler():
    dataset = mg.data.TensorDataset(np.arange(10, dtype=np.float32), np.arange(10))
    sampler = DistributedSampler(dataset, 2, 1, shuffle=False)
    loader = mg.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    assert [y.tolist() for _, y in loader] == [[1, 3], [5, 7], [9]]
    assert mg.data.DistributedSampler is DistributedSampler


@pytest.mark.parametrize("replicas,rank,message", [(2, 2, "invalid rank 2"), (2, -1, "invalid rank -1"),
                                                   (0, 0, "positive integer"), (2.5, 0, "positive integer")])
def test_bad_rank_or_replicas_is_an_error(replicas, rank, message):
    with pytest.raises(mg.ArgumentError, match=message):
        DistributedSampler(range(4), num_replicas=replicas, rank=rank)
