"""Large output buffers kept for reuse from one run to the next.

A training step allocates the same buffers at every iteration. malloc maps an allocation of more
than a few hundred KiB fresh from the operating system and returns it at free, so each of them
page-faults on its first write, inside the kernel that writes it: ResNet-18's 9 MiB weight updates
took 7.7 ms per call instead of 1.4. The pool keeps such arrays once their last user has dropped
them and hands them out again for the same size.
"""
import sys
import threading

import numpy as np

POOLED_MIN = 256 * 1024      # smaller arrays come from malloc's heap, whose pages stay mapped
POOL_MAX = 1 << 30           # bytes the pool may hold, in use or free


class Pool:
    """Raw byte arrays by size. An array is free when nothing but the pool refers to it: every
    array handed out is a view, which refers to its raw array until it is freed itself. A lock
    keeps two threads that realise at once from taking the same free array."""

    def __init__(self, limit=POOL_MAX):
        self.limit, self.held, self.arrays = limit, 0, {}
        self.lock = threading.Lock()

    def take(self, count, dtype):
        """A 1-D array of `count` elements of numpy `dtype` that no one else uses."""
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes < POOLED_MIN:
            return np.empty(count, dtype)
        with self.lock:
            return self._take(nbytes, count, dtype)

    def _take(self, nbytes, count, dtype):
        bucket = self.arrays.setdefault(nbytes, [])
        for raw in bucket:
            if sys.getrefcount(raw) == 3:     # the bucket, the loop variable and the call
                return raw.view(dtype)
        if self.held + nbytes > self.limit:
            self._release()
            if self.held + nbytes > self.limit:
                return np.empty(count, dtype)
        raw = np.empty(nbytes, np.uint8)
        bucket.append(raw)
        self.held += nbytes
        return raw.view(dtype)

    def release(self):
        """Drop every free array (their memory goes back to malloc)."""
        with self.lock:
            self._release()

    def _release(self):
        for nbytes, bucket in self.arrays.items():
            kept = [raw for raw in bucket if sys.getrefcount(raw) > 3]   # the bucket, raw, the call
            self.held -= nbytes * (len(bucket) - len(kept))
            bucket[:] = kept
