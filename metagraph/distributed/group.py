"""The default process group, as torch.distributed's: init_process_group, get_rank,
get_world_size, is_initialized, barrier, destroy_process_group.

The group comes from the MPI environment (`mpirun -n N python train.py`); launched any other way
it is a world of one process. get_rank() and get_world_size() initialise it on first use (Jittor's
`jt.rank` habit): PyTorch would raise instead, but there is nothing to configure here that the
launcher has not already said.
"""
import time

from metagraph.errors import ArgumentError, MetagraphError, Unsupported
from metagraph.distributed import world as worlds
from metagraph.runtime import profiler

# PyTorch's backend names that mean "collectives on host memory", which MPI provides here.
HOST_BACKENDS = (None, "mpi", "gloo")


class DistributedError(MetagraphError, ValueError):
    """Ranks that disagree: a collective called with different shapes, dtypes or arguments on
    different ranks, or a model whose parameters differ between ranks."""


class _Group:
    world = None               # the LocalWorld or MPIWorld, once initialised
    remove_hook = None


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name=""):
    """Join the processes the MPI launcher started (a world of one without a launcher or without
    mpi4py). backend may be None, "mpi" or "gloo" (PyTorch's CPU backend: here it is MPI);
    init_method None or "env://" (the launcher's environment is the rendezvous); world_size and
    rank, when given, must be what the launcher says. timeout is accepted and not enforced: a
    rank that raises aborts every rank instead (see metagraph.distributed.world). Calling it
    again with compatible arguments does nothing."""
    if backend is not None and str(backend).lower() not in HOST_BACKENDS:
        raise Unsupported(f"init_process_group: backend {backend!r} is not available; metagraph runs "
                          "collectives on host memory through MPI (backend 'mpi', or PyTorch's 'gloo')")
    if init_method not in (None, "env://"):
        raise Unsupported(f"init_process_group: init_method {init_method!r}: the MPI launcher (mpirun) "
                          "tells each process its rank and the world size; leave init_method unset")
    if store is not None:
        raise Unsupported("init_process_group: a store is not used; the MPI launcher connects the ranks")
    if _Group.world is None:
        _Group.world = worlds.make_world()
        if _Group.world.size > 1:
            _Group.remove_hook = worlds.install_abort_hook(_Group.world)
    world = _Group.world
    if world_size not in (-1, None) and world_size != world.size:
        raise ArgumentError(f"init_process_group: world_size={world_size}, but the launcher started "
                            f"{world.size} process(es) (mpirun -n {world_size} starts {world_size})")
    if rank not in (-1, None) and rank != world.rank:
        raise ArgumentError(f"init_process_group: rank={rank}, but the launcher made this process rank "
                            f"{world.rank}")


def destroy_process_group(group=None):
    """Leave the process group (the MPI library itself is finalised when the process exits)."""
    _check_group("destroy_process_group", group)
    if _Group.world is not None:
        _Group.world.free()
    if _Group.remove_hook is not None:
        _Group.remove_hook()
    _Group.world, _Group.remove_hook = None, None


def is_initialized():
    """Whether init_process_group (or a first get_rank) has run."""
    return _Group.world is not None


def is_available():
    """Always true: without MPI the group is a world of one process."""
    return True


def is_mpi_available():
    """Whether mpi4py is installed (metagraph[distributed])."""
    return worlds.mpi_available()


def in_mpi():
    """Whether an MPI launcher started this process and mpi4py is there to join its world
    (Jittor's `jt.in_mpi`); read from the environment, without initialising MPI."""
    return worlds.launched_size() is not None and worlds.mpi_available()


def get_rank(group=None):
    """This process's rank, 0 to world size - 1 (initialises the group on first use)."""
    return current_world("get_rank", group).rank


def get_world_size(group=None):
    """The number of processes in the group (initialises the group on first use)."""
    return current_world("get_world_size", group).size


def barrier(group=None, async_op=False, device_ids=None):
    """Wait until every rank has reached its barrier."""
    world = current_world("barrier", group)
    start = time.perf_counter()
    world.barrier()
    record("barrier", 0, start)
    return completed_work() if async_op else None


def current_world(op, group=None):
    """The world the collectives run on, initialised from the environment if need be."""
    _check_group(op, group)
    if _Group.world is None:
        init_process_group()
    return _Group.world


def _check_group(op, group):
    if group is not None and group is not WORLD:
        raise Unsupported(f"{op}: only the default group (group=None) exists; new_group() is not supported")


class _World:
    """`group.WORLD`, PyTorch's name for the default group."""

    def __repr__(self):
        return "metagraph.distributed.group.WORLD"


WORLD = _World()


class Work:
    """What a collective called with async_op=True returns. Collectives complete before they return
    (MPI's blocking calls), so wait() returns at once; PyTorch code that waits runs unchanged."""

    def wait(self, timeout=None):
        """The collective has completed; returns True."""
        return True

    def is_completed(self):
        """True: the collective completed before it returned."""
        return True

    def is_success(self):
        """True: a failed collective raises instead."""
        return True


def completed_work():
    """A Work for a collective that has completed."""
    return Work()


def record(name, nbytes, start):
    """Report a collective that moved `nbytes` and began at `start` to the active mg.profile()."""
    report = profiler.current()
    if report is not None:
        report.collective(name, nbytes, start, time.perf_counter() - start)
