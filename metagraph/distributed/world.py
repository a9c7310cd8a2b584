"""The process group: who this process is among the processes an MPI launcher started, and the
collectives on numpy buffers that the tensor-level API and DistributedDataParallel build on.

Without an MPI launcher (or without mpi4py) the world is this one process: every collective is
the identity on its buffers and nothing imports mpi4py. Under a launcher (`mpirun -n N ...`) the
world is a duplicate of MPI_COMM_WORLD, so that metagraph's messages never meet the user's own
mpi4py traffic, and an uncaught exception on any rank aborts every rank (MPI_Abort): a rank that
raises ends the job within the launcher's kill time instead of leaving the others waiting forever
in their next collective.
"""
import os
import sys
import warnings

import numpy as np

# Variables an MPI launcher sets in each process it starts: Open MPI, PMIx (Open MPI 5, PRRTE),
# MPICH's and Intel MPI's hydra (PMI), MVAPICH.
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")


def launched_size():
    """The number of processes the MPI launcher that started this one says it started, or None
    when no launcher did (read from the environment: nothing is imported)."""
    for name in SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    if any(os.environ.get(name, "").isdigit() for name in RANK_VARIABLES):
        return 0        # a launcher, whose size variable we do not know: MPI will tell
    return None


def mpi_available():
    """Whether mpi4py can be imported (without importing it: that would initialise MPI)."""
    import importlib.util
    return importlib.util.find_spec("mpi4py") is not None


class LocalWorld:
    """A world of one process: each collective leaves its result equal to its input."""
    rank = 0
    size = 1
    uses_mpi = False

    def allreduce(self, send, receive, op):
        """receive = op over the ranks of send (buffers of the same shape and dtype)."""
        if receive is not send:
            np.copyto(receive, send)

    def broadcast(self, buffer, root):
        """Every rank's buffer takes root's values."""

    def allgather(self, send, receive):
        """Block r of receive (world size blocks of send's size, in rank order) = rank r's send."""
        np.copyto(receive.reshape(-1)[:send.size], send.reshape(-1))

    def reduce_scatter(self, send, receive, op):
        """receive = op over the ranks of block `rank` of send (world size blocks of receive's size)."""
        np.copyto(receive.reshape(-1), send.reshape(-1)[:receive.size])

    def barrier(self):
        """Wait until every rank has called barrier()."""

    def abort(self, code):
        """End this process (and, under MPI, every rank) with exit status `code`."""
        os._exit(code)

    def free(self):
        """Release the communicator."""


class MPIWorld(LocalWorld):
    """The processes an MPI launcher started, through mpi4py's buffer (upper-case) API: each
    call passes numpy arrays, which MPI reads and writes in place (no pickling, no Python lists)."""
    uses_mpi = True

    def __init__(self):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "product": MPI.PROD,
                    "or": MPI.LOR, "and": MPI.LAND}

    def allreduce(self, send, receive, op):
        send = self.MPI.IN_PLACE if send is receive else send
        self.comm.Allreduce(send, receive, self.ops[op])

    def broadcast(self, buffer, root):
        self.comm.Bcast(buffer, root)

    def allgather(self, send, receive):
        self.comm.Allgather(send, receive)

    def reduce_scatter(self, send, receive, op):
        self.comm.Reduce_scatter_block(send, receive, self.ops[op])

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code):
        self.comm.Abort(code)

    def free(self):
        self.comm.Free()


def make_world():
    """The world this process belongs to: MPI's under a launcher when mpi4py is installed, else
    a world of one (with a warning when a launcher started several processes: each would then
    train alone)."""
    size = launched_size()
    if size is None:
        return LocalWorld()
    if not mpi_available():
        if size != 1:
            warnings.warn(f"metagraph.distributed: an MPI launcher started {size or 'several'} processes but "
                          "mpi4py is not installed, so each process is a world of one and trains alone; "
                          "install it with pip install 'metagraph[distributed]'", stacklevel=3)
        return LocalWorld()
    return MPIWorld()


def install_abort_hook(world):
    """Make an uncaught exception on this rank abort every rank after printing its traceback (the
    hook that was installed before prints it). Returns a function that removes the hook."""
    previous = sys.excepthook

    def abort_every_rank(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stderr.write(f"metagraph.distributed: rank {world.rank} of {world.size} raised {kind.__name__}; "
                         "aborting every rank (MPI_Abort)\n")
        sys.stderr.flush()
        sys.stdout.flush()
        world.abort(1)

    sys.excepthook = abort_every_rank

    def remove():
        if sys.excepthook is abort_every_rank:
            sys.excepthook = previous
    return remove
