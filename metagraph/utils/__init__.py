"""Utilities under PyTorch's names: `metagraph.utils.data` is `torch.utils.data`."""
from metagraph.utils import data
