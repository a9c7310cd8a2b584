"""An OpenCL device's memory: its context and queue, tensors' buffers on it (DeviceArray, from a
bounded pool), transfers between host and device (counted by `mg.profile()`), and what
`executor.run` asks of a memory (DeviceMemory: resident inputs, outputs, error words).

Kernels run on one in-order queue: a launch returns without waiting for the kernels queued
before it, and only a read back to the host waits for them. A run's kernels report a failed
check through two words on the device ([step + 1, check] of the first that failed), read once
after the last launch, and only when a kernel that can fail was launched: reading after each
launch would wait for every kernel.
"""
import threading
import time
import weakref

import numpy as np

from metagraph.errors import CompileError, OutOfMemory
from metagraph.runtime import executor, profiler

POOL_HELD_MAX = 1 << 30        # bytes of free device buffers the pool keeps for reuse
NUMBERS_KEPT = 256             # 0-d host values kept on the device by value (Device.resident)
MIN_BYTES = 8                  # a buffer of no bytes cannot be made, nor passed to a kernel
INSTALL = ('pip install -e ".[opencl]" (pyopencl, and PoCL for running on the CPU; on a CPU newer '
           "than that PoCL's LLVM 14, a newer PoCL as well: Debian's pocl-opencl-icd)")


def _pyopencl():
    try:
        import pyopencl
        import pyopencl.tools
    except ImportError as error:
        raise CompileError(f"the opencl backend needs pyopencl: {INSTALL} ({error})") from None
    return pyopencl


PROBE_SOURCE = "__kernel void probe(__global float *x) { x[get_global_id(0)] *= 2.0f; }"


def _choose(cl):
    """The device to compute on: the first GPU or accelerator of any platform, else the first
    device, among those whose driver builds a trivial kernel. A driver can list a device it cannot
    compile for: PoCL 3.0 (LLVM 14, the one pyopencl's wheels bring) names a CPU newer than its
    LLVM (AMD Zen 5) 'generic', which LLVM 14 rejects, so every build fails."""
    devices, reasons = [], []
    try:
        platforms = cl.get_platforms()
    except cl.Error as error:
        platforms, reasons = [], [str(error).splitlines()[0]]
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error as error:           # a platform without a device of its kinds
            reasons.append(f"{platform.name}: {str(error).splitlines()[0]}")
    preferred = [d for d in devices if d.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR)]
    for device in preferred + [d for d in devices if d not in preferred]:
        failure = _build_failure(cl, device)
        if failure is None:
            return device
        reasons.append(f"{device.platform.version} on {device.name}: {failure}")
    raise CompileError(f"no OpenCL device that builds a kernel is installed "
                       f"({'; '.join(reasons) or 'no platform'}); {INSTALL}")


def _build_failure(cl, device):
    """Why the device's driver cannot build PROBE_SOURCE (the first line of its log that says),
    or None when it can."""
    try:
        cl.Program(cl.Context([device]), PROBE_SOURCE).build()
    except cl.Error as error:
        lines = [line for line in str(error).splitlines() if "error" in line.lower()]
        return (lines[-1] if lines else str(error).splitlines()[0]).strip()
    return None


class DeviceArray:
    """A value in an OpenCL device's memory: its buffer, shape and numpy dtype. `numpy()` (or
    np.asarray) copies it to the host."""
    __slots__ = ("buffer", "shape", "dtype", "size", "nbytes", "device", "__weakref__")

    def __init__(self, buffer, shape, dtype, device):
        self.buffer, self.shape, self.dtype, self.device = buffer, tuple(shape), np.dtype(dtype), device
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize

    @property
    def ndim(self):
        """The number of dimensions."""
        return len(self.shape)

    def numpy(self):
        """A host copy of the value (a transfer)."""
        return self.device.download(self)

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device.name!r})"


class Device:
    """One OpenCL device: context, queue, buffer pool and what it supports."""

    def __init__(self):
        cl = self.cl = _pyopencl()
        device = _choose(cl)
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.pool = cl.tools.MemoryPool(cl.tools.ImmediateAllocator(self.queue))
        self.device, self.name = device, device.name
        platform = device.platform
        # what a binary built for this device depends on: the cache key's toolchain identity
        self.identity = "\n".join([platform.name, platform.version, device.name, device.version,
                                   device.driver_version])
        self.fp64 = "cl_khr_fp64" in device.extensions.split()
        if device.profile != "FULL_PROFILE" and "cles_khr_int64" not in device.extensions.split():
            raise CompileError(f"the OpenCL device {device.name} has no 64-bit integers (an embedded "
                               "profile without cles_khr_int64): metagraph's kernels index in int64")
        self.compute_units = device.max_compute_units
        self.max_group = device.max_work_group_size
        self.uploads = weakref.WeakKeyDictionary()    # host-valued node -> its copy on the device
        self.numbers = {}                             # (dtype, bytes) of a 0-d host value -> its copy
        self.words = threading.local()                # per thread: the error words (see ErrorWords)

    # ---- buffers ----------------------------------------------------------------------------
    def allocate(self, shape, dtype):
        """An uninitialised DeviceArray of `shape` and numpy `dtype` from the pool."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        try:
            buffer = self.pool.allocate(max(nbytes, MIN_BYTES))
        except self.cl.Error as error:       # (more than the device allocates at once: a LogicError)
            raise OutOfMemory(f"cannot allocate {nbytes} bytes on the OpenCL device {self.name} "
                              f"({str(error).splitlines()[0]})") from None
        return DeviceArray(buffer, shape, dtype, self)

    def trim(self):
        """Free the pool's unused buffers once they exceed POOL_HELD_MAX bytes."""
        if self.pool.managed_bytes - self.pool.active_bytes > POOL_HELD_MAX:
            self.pool.free_held()

    def empty_cache(self):
        """Give every unused buffer the pool keeps back to the driver."""
        self.pool.free_held()

    # ---- transfers --------------------------------------------------------------------------
    def upload(self, array):
        """A DeviceArray holding a copy of host `array` (a transfer)."""
        array = np.ascontiguousarray(array)
        out = self.allocate(array.shape, array.dtype)
        start = time.perf_counter()
        if array.nbytes:
            self.cl.enqueue_copy(self.queue, out.buffer, array.reshape(-1).view(np.uint8))
        _count("to_device", array.nbytes, start)
        return out

    def download(self, value):
        """A host copy of DeviceArray `value` (a transfer: it waits for the kernels that write it)."""
        out = np.empty(value.shape, value.dtype)
        start = time.perf_counter()
        if value.nbytes:
            self.cl.enqueue_copy(self.queue, out.reshape(-1).view(np.uint8), value.buffer)
        _count("to_host", value.nbytes, start)
        return out

    def resident(self, node):
        """The DeviceArray kernels read for a realised node: its own, or a copy of a host value
        (an index table built on the host, or any value on the `cpu` device when the opencl backend
        computes that device's graphs), uploaded once per node (values never change). A 0-d value
        is kept by value: an optimizer makes its hyperparameters 0-d tensors anew at every step."""
        buffer = node.buffer
        if isinstance(buffer, DeviceArray):
            return buffer
        copy = self.uploads.get(node)
        if copy is None:
            copy = self.uploads[node] = self.number(buffer) if buffer.ndim == 0 else self.upload(buffer)
        return copy

    def number(self, value):
        """The device's copy of a 0-d host array, one per value."""
        key = (value.dtype.name, value.tobytes())
        copy = self.numbers.get(key)
        if copy is None:
            if len(self.numbers) >= NUMBERS_KEPT:
                self.numbers.pop(next(iter(self.numbers)))
            copy = self.numbers[key] = self.upload(value)
        return copy

    def error_words(self):
        """This thread's two error words on the device (zero unless a failure is being reported)."""
        words = getattr(self.words, "buffer", None)
        if words is None:
            words = self.words.buffer = self.allocate((2,), np.int64)
            self.clear(words)
        return words

    def clear(self, value):
        """Set every byte of DeviceArray `value` to zero, on the device."""
        self.cl.enqueue_fill_buffer(self.queue, value.buffer, np.uint8(0), 0, value.nbytes)


def _count(direction, nbytes, start):
    report = profiler.current()
    if report is not None:
        report.transfer(direction, nbytes, start, time.perf_counter() - start)


class ErrorWords:
    """The error words of one run on a device (executor.run's errors): a kernel that fails a check
    writes [step + 1, check] unless an earlier step has; read once, after the last launch."""

    def __init__(self, device):
        self.device, self.step, self.watched = device, 0, False

    def at(self, step):
        """What step `step`'s launch is given (the launcher reads `step` and `buffer()`)."""
        self.step = step
        return self

    def buffer(self):
        """The words, for a kernel that can fail a check (they are read at the end of the run)."""
        self.watched = True
        return self.device.error_words().buffer

    @staticmethod
    def site():
        """A failure known now: never on a device (see failure())."""
        return 0

    def failure(self):
        """(step, check) of the first step that failed a check, or None; the words are cleared."""
        if not self.watched:
            return None
        words = self.device.error_words()
        step, site = (int(v) for v in words.numpy())
        if not step:
            return None
        self.device.clear(words)
        return step - 1, site


class DeviceMemory:
    """What executor.run asks of a memory, for graphs computed on an OpenCL device: realised
    inputs resident on it, outputs from its pool, error words. `to_host`: the graph's values
    belong on the host (the `cpu` device computed by the opencl backend): every value the run
    computed is copied back at its end."""

    def __init__(self, device, to_host):
        self.device, self.to_host = device, to_host

    def resident(self, node):
        """The DeviceArray kernels read for a realised node (Device.resident)."""
        return self.device.resident(node)

    def allocate(self, node):
        """A DeviceArray for node's value; an allocation that fails names the node."""
        try:
            return self.device.allocate(node.shape, node.dtype.np)
        except OutOfMemory as error:
            raise executor.for_node(error, node) from None

    def errors(self):
        """A run's error words."""
        return ErrorWords(self.device)

    def finish(self, graph, buffers):
        """The run's buffers as the caller keeps them."""
        if self.to_host:
            buffers = {k: buffers[k].numpy() if graph.nodes[k].buffer is None else graph.nodes[k].buffer
                       for k in buffers}
        self.device.trim()
        return buffers
