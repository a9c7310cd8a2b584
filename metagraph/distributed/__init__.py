"""Data-parallel training on MPI, with torch.distributed's names: `mpirun -n 2 python train.py`
starts two processes that join one process group (init_process_group, get_rank,
get_world_size) and exchange tensors through collectives (all_reduce, broadcast, all_gather,
reduce_scatter). `metagraph.nn.parallel.DistributedDataParallel` averages gradients over the
ranks and `metagraph.utils.data.DistributedSampler` gives each rank its share of a dataset.

Without an MPI launcher, or without mpi4py (`pip install "metagraph[distributed]"`), the group
is a world of one process and every collective leaves its tensors as they are, so the same
script runs alone unchanged. Importing this package does not import mpi4py: the group is made
on first use.
"""
import types

from metagraph.distributed.collectives import (ReduceOp, all_gather, all_gather_into_tensor, all_reduce,
                                               broadcast, reduce_scatter, reduce_scatter_tensor)
from metagraph.distributed.group import (WORLD, DistributedError, Work, barrier, destroy_process_group,
                                         get_rank, get_world_size, in_mpi, init_process_group, is_available,
                                         is_initialized, is_mpi_available)

group = types.SimpleNamespace(WORLD=WORLD)      # torch.distributed.group.WORLD: the default group

__all__ = ["ReduceOp", "Work", "DistributedError", "group", "init_process_group", "destroy_process_group",
           "is_initialized", "is_available", "is_mpi_available", "in_mpi", "get_rank", "get_world_size",
           "barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor"]
