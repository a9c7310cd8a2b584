"""Large output buffers kept for reuse from one run to the next.

A training step allocates the same buffers at every iteration. malloc maps an allocation of more
than a few hundred KiB fresh from the operating system and returns it at free, so each of them
page-faults on its first write, inside the kernel that writes it: ResNet-18's 9 MiB weight updates
took 7.7 ms per call instead of 1.4. The pool keeps such arrays once their last user has dropped
them and hands them out again for the same size.
"""
import math
import mmap
import sys
import threading
import weakref

import numpy as np

from metagraph.errors import OutOfMemory

POOLED_MIN = 256 * 1024      # smaller arrays come from malloc's heap, whose pages stay mapped
POOL_MAX = 1 << 30           # bytes the pool may hold, in use or free
SWEEP_EVERY, KEPT_GENERATIONS = 4, 4    # see Pool.age
LINE_BYTES = 64              # a cache line: where a user's values start (aligned_empty)
ZEROED_MAX = 32 * 1024       # arrays this small are zeroed whole (one calloc), not their slack alone:
                             # one numpy call instead of three (0.4 us for 16 KiB, not 0.6)


class Pool:
    """Raw byte arrays by size. Each array handed out is a view of one; when it is freed, its raw
    array is returned (a weak reference's callback), and taken again if nothing else still refers
    to it (a view the user took of it); one that is still referred to leaves the pool, and its
    memory goes back to malloc with its last view. A lock keeps threads that realise at once
    apart."""

    def __init__(self, limit=POOL_MAX):
        self.limit, self.held = limit, 0
        self.arrays = {}       # (nbytes, slack) -> {id: raw array} for every array the pool holds
        self.returned = {}     # (nbytes, slack) -> raw arrays whose handed-out view has been freed
        self.lent = {}         # id(weak reference to an array handed out) -> (it, size, raw array)
        self.taken = {}        # (nbytes, slack) -> the generation (`age`) it was last taken in
        self.once = {}         # (nbytes, slack) -> its last generation, for a size not (yet) `durable`
        self.durable = set()   # sizes two realisations KEPT_GENERATIONS apart or less took
        self.generation = 0
        self.lock = threading.Lock()

    def take(self, shape, dtype, slack=0, zero_tail=True):
        """An uninitialised array of `shape` and numpy `dtype`, followed by `slack` bytes (a
        multiple of the itemsize), zero unless `zero_tail` is False: the replay loop zeroes them
        itself before the kernel that writes the array runs. A small array is then not zeroed at
        all (a 64x64 matmul at two threads, its kernel timed alone over fresh outputs: 3.3-3.4 us
        into calloc'd memory, 3.0-3.2 into malloc's; the take itself 0.87 -> 0.77 us)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize + slack
        if nbytes <= ZEROED_MAX:
            raw = np.zeros(nbytes, np.uint8) if zero_tail else np.empty(nbytes, np.uint8)
            return np.ndarray(shape, dtype, raw)
        if nbytes >= POOLED_MIN:
            size = (nbytes, slack)
            with self.lock:
                self.taken[size] = self.generation
                if size not in self.durable:
                    last = self.once.get(size)
                    if last is not None and 0 < self.generation - last <= KEPT_GENERATIONS:
                        self.durable.add(size)      # taken again soon: a training step's, say
                        del self.once[size]
                    else:
                        self.once[size] = self.generation
                raw = self._raw(size)
            if raw is not None:
                out = np.ndarray(shape, dtype, raw)
                ref = weakref.ref(out, self._give_back)
                self.lent[id(ref)] = (ref, size, raw)
                return out
        return np.ndarray(shape, dtype, _zero_tailed(nbytes, slack if zero_tail else 0))

    def references(self, raw, slack):
        """How many references this pool holds to `raw`, the byte array under an array it handed
        out with `slack` (two: its table and the loan's record; none if it is not the pool's)."""
        held = self.arrays.get((raw.nbytes, slack), {}).get(id(raw)) is raw
        return 2 * held

    def _give_back(self, ref):
        """An array handed out has been freed: its raw array may be taken again."""
        _, size, raw = self.lent.pop(id(ref))
        self.returned.setdefault(size, []).append(raw)

    def _raw(self, size):
        """A raw array of size = (nbytes, slack) no one uses, or None past the limit. Its last
        `slack` bytes are zero: they are zeroed when it is made, and no kernel writes them."""
        nbytes, slack = size
        returned = self.returned.get(size, [])
        while returned:
            raw = returned.pop()
            if sys.getrefcount(raw) == 3:      # the pool's table, `raw` and the call
                return raw
            self._forget(size, raw)            # a view of it outlived the array handed out
        if self.held + nbytes > self.limit:
            self._release()
            if self.held + nbytes > self.limit:
                return None
        raw = _zero_tailed(nbytes, slack)
        self.arrays.setdefault(size, {})[id(raw)] = raw
        self.held += nbytes
        return raw

    def free_bytes(self):
        """Bytes of the arrays the pool holds that nobody uses (kept for reuse)."""
        return sum(size[0] * len(returned) for size, returned in self.returned.items())

    def _forget(self, size, raw):
        held = self.arrays[size]
        del held[id(raw)]
        if not held:
            del self.arrays[size]
        self.held -= size[0]

    def age(self):
        """One realisation has ended. The free arrays of a size that is not `durable` and that no
        realisation took since the one before this go back to the operating system: a loop over
        batch sizes takes each size once (a small CNN over sizes 1..200 held 138 MiB at the end,
        four generations of sizes, where size 200 alone holds 49), while a training loop takes every
        size it keeps at every step, and its sizes turn durable at its second step (whose arrays
        are made again, once). Every SWEEP_EVERY realisations, the free arrays of sizes no
        realisation took during the last KEPT_GENERATIONS go too, and those sizes are no longer
        durable: a loop over batch sizes 1..30 (ResNet-18 inference) held every size's buffers, 90
        -> 310 MiB of RSS."""
        self.generation += 1
        if self.once:
            with self.lock:
                for size, last in list(self.once.items()):
                    if last < self.generation - 1:
                        for raw in self.returned.pop(size, ()):
                            self._forget(size, raw)
                        if last < self.generation - KEPT_GENERATIONS:
                            del self.once[size]         # (too long ago to make it durable)
        if self.generation % SWEEP_EVERY or not self.taken:     # (most realisations: nothing to do)
            return
        with self.lock:
            stale = [size for size, taken in self.taken.items()
                     if taken < self.generation - KEPT_GENERATIONS]
            for size in stale:
                del self.taken[size]
                self.durable.discard(size)
                for raw in self.returned.pop(size, ()):
                    self._forget(size, raw)

    def release(self):
        """Drop every free array (its memory goes back to malloc)."""
        with self.lock:
            self._release()

    def _release(self):
        for size, returned in self.returned.items():
            while returned:
                self._forget(size, returned.pop())


HOST = Pool()       # the host's, which the executor allocates from (mg.profile reports it)


def aligned_empty(shape, dtype):
    """An uninitialised array whose data starts on a cache line (64 bytes), for a user's values
    (creation.from_numpy_array): malloc's 16-byte alignment splits every vector a kernel loads.
    It is a view of a larger byte array, so it is never donated (donation.laid_out)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + LINE_BYTES, np.uint8)
    start = -raw.ctypes.data % LINE_BYTES
    return np.ndarray(shape, dtype, raw, start)


def _zero_tailed(nbytes, slack):
    """A fresh byte array whose last `slack` bytes are zero (the rest uninitialised). One the pool
    keeps (at least POOLED_MIN bytes) is mapped from the operating system itself, page-aligned and
    zeroed: malloc maps large blocks 16 bytes past a page's start, so every 64-byte vector of a
    kernel's rows straddled two cache lines (a 3x3 conv's weight gradient, (8, 64, 56, 56) on one
    core: 17.5 ms with its operands aligned, 24.5 ms at 16 bytes past). The array owns no data
    but its base is the mapping, not an array, so every view of it names it as its base, as
    donation's reference counts need."""
    try:
        if nbytes >= POOLED_MIN:
            return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
        raw = np.empty(nbytes, np.uint8)
    except (MemoryError, ValueError, OSError):    # ValueError: more bytes than an address can reach
        raise OutOfMemory(f"cannot allocate {nbytes} bytes ({nbytes / 2 ** 30:.1f} GiB)") from None
    raw[nbytes - slack:] = 0
    return raw
