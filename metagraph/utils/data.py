"""The data loading API of `metagraph.data` under PyTorch's path, so that
`from metagraph.utils.data import DataLoader, TensorDataset` works as `torch.utils.data` does."""
from metagraph.data import (BatchSampler, DataLoader, Dataset, LoaderTimeout, RandomSampler,  # noqa: F401
                            SequentialSampler, TensorDataset, default_collate, default_convert)
from metagraph.utils.distributed_sampler import DistributedSampler  # noqa: F401
