"""Every environment variable metagraph reads, in one place.

METAGRAPH_BACKEND      backend to start with: c (the default when a C compiler works), llvm (the
                       default without one), bang (BANG-style kernels run on the CPU) or numpy
METAGRAPH_DEBUG        1: a line per kernel launch (with the ops and lines it was built from:
                       `conv2d+relu @ model.py:41`) and compile; 2: also the generated source;
                       3: also the fused graph of every new schedule
METAGRAPH_CACHE_DIR    where compiled kernels are kept (default ~/.cache/metagraph; one that cannot be
                       written falls back to a temporary directory, with a warning)
METAGRAPH_NUM_THREADS  OpenMP threads per kernel (default: the CPUs this process may run on: its
                       affinity mask, capped by a cgroup CPU quota)
METAGRAPH_CHECK        1: run the numpy oracle beside every kernel and raise on the first mismatch
METAGRAPH_LIBRARY      1: contractions that are einsums (matmul, linear, 1x1 conv) run through the BLAS
                       numpy links instead of generated code (off by default; settable at run time)
METAGRAPH_TUNE         seconds a process may spend timing variants of its slow register-tiled
                       kernels, on a schedule's second run, to remember the fastest on disk
                       (default 5; 0: the heuristic choice, no timing; pipeline/tuning.py)
METAGRAPH_BANG_NRAM    bytes of on-chip scratchpad a `bang` kernel tiles for (default 512 KiB)
CC                     the C compiler (default cc)
"""
import os


def _int(name, default):
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


BACKEND = os.environ.get("METAGRAPH_BACKEND", "")
DEBUG = _int("METAGRAPH_DEBUG", 0)
CACHE_DIR = os.environ.get("METAGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "metagraph")
def usable_cpus(cgroup_root="/sys/fs/cgroup"):
    """The CPUs this process may use: its affinity mask (os.cpu_count() ignores it: pinned to one
    core, two OpenMP threads made a kernel 50x slower), capped by a cgroup v2 or v1 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    return max(1, min(count, quota) if quota else count)


def _cgroup_quota(root):
    """ceil(quota / period) of the CPU controller, or None when unlimited or unreadable."""
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            with open(os.path.join(root, quota_file)) as stream:
                fields = stream.read().split()
            if period_file is not None:
                with open(os.path.join(root, period_file)) as stream:
                    fields = fields[:1] + stream.read().split()[:1]
            quota, period = fields[0], int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        if quota == "max" or int(quota) <= 0 or period <= 0:
            return None
        return -(-int(quota) // period)
    return None


NUM_THREADS = _int("METAGRAPH_NUM_THREADS", usable_cpus())
CHECK = _int("METAGRAPH_CHECK", 0)
BANG_NRAM = _int("METAGRAPH_BANG_NRAM", 512 * 1024)
LIBRARY = _int("METAGRAPH_LIBRARY", 0)
TUNE = _int("METAGRAPH_TUNE", 5)
