"""Every environment variable metagraph reads, in one place.

METAGRAPH_BACKEND      backend to start with: c (the default when a C compiler works), llvm (the
                       default without one), bang (BANG-style kernels run on the CPU) or numpy
METAGRAPH_DEBUG        1: a line per kernel launch and compile; 2: also the generated source;
                       3: also the fused graph of every new schedule
METAGRAPH_CACHE_DIR    where compiled kernels are kept (default ~/.cache/metagraph)
METAGRAPH_NUM_THREADS  OpenMP threads per kernel (default: the machine's cores)
METAGRAPH_CHECK        1: run the numpy oracle beside every kernel and raise on the first mismatch
METAGRAPH_LIBRARY      1: contractions that are einsums (matmul, linear, 1x1 conv) run through the BLAS
                       numpy links instead of generated code (off by default; settable at run time)
METAGRAPH_TUNE         seconds a process may spend timing variants of its slow register-tiled
                       kernels, on a schedule's second run, to remember the fastest on disk
                       (default 5; 0: the heuristic choice, no timing; codegen/tuning.py)
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
NUM_THREADS = _int("METAGRAPH_NUM_THREADS", os.cpu_count() or 1)
CHECK = _int("METAGRAPH_CHECK", 0)
BANG_NRAM = _int("METAGRAPH_BANG_NRAM", 512 * 1024)
LIBRARY = _int("METAGRAPH_LIBRARY", 0)
TUNE = _int("METAGRAPH_TUNE", 5)
