"""Which backend realises graphs (the active one for the cpu device's values, a device's own for
that device's: DEVICE_BACKENDS), and the one call through which every value is computed and moved
between devices."""
import sys
import warnings
import weakref

import numpy as np

from metagraph import flags
from metagraph.device import CPU_NAME, OPENCL_NAME
from metagraph.errors import MetagraphError
from metagraph.ops.table import PENDING_COPIES, copy

_active = None
_instances = {}  # name -> backend made once (a backend holds its loaded kernels and schedules)
_deferred = {}   # id -> weak reference of tensors updated in place, computed at the next realisation
                 # (by identity: a WeakSet would compare tensors with their element-wise ==)


def _numpy():
    from metagraph.codegen.interpreter import NumpyBackend
    return NumpyBackend()


def _pipeline(generator):
    """The realisation pipeline over a code generator: what realises graphs with its kernels."""
    from metagraph.pipeline.realize import Pipeline
    return Pipeline(generator)


def _c():
    from metagraph.codegen.c import CBackend
    return _pipeline(CBackend())


def _llvm():
    from metagraph.codegen.llvm import LLVMBackend
    return _pipeline(LLVMBackend())


def _bang():
    from metagraph.codegen.bang import BangBackend
    return _pipeline(BangBackend())


def _opencl():
    from metagraph.codegen.opencl import OpenCLBackend
    return _pipeline(OpenCLBackend())


BACKENDS = {"c": _c, "llvm": _llvm, "bang": _bang, "numpy": _numpy, "opencl": _opencl}
# device -> the backend that computes its values, whatever backend is active (the cpu's: the active one)
DEVICE_BACKENDS = {OPENCL_NAME: "opencl"}
DEFAULT_ORDER = ("c", "llvm", "numpy")


def _instance(name):
    if name not in _instances:
        _instances[name] = BACKENDS[name]()
    return _instances[name]


def set_backend(name):
    """Make `name` the backend that realises every later computation (raises if it cannot work here)."""
    global _active
    if name not in BACKENDS:
        raise MetagraphError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    _active = _instance(name)


def get_backend():
    """The name of the active backend (chosen on first use: METAGRAPH_BACKEND, else the first that works)."""
    global _active
    if _active is None:
        if flags.BACKEND:
            set_backend(flags.BACKEND)
        else:
            for name in DEFAULT_ORDER:
                try:
                    _active = _instance(name)
                    break
                except MetagraphError as error:
                    reason = str(error).splitlines()[0]
                    warnings.warn(f"metagraph: backend {name!r} is unavailable ({reason}); "
                                  "trying the next one", stacklevel=2)
    return _active.name


def defer(tensor):
    """Compute this tensor's new value at the next realisation, whatever that realisation asks for."""
    _deferred[id(tensor)] = weakref.ref(tensor)


def realize_on_host(node):
    """Compute one node now with the numpy interpreter: for cheap host work such as parameter
    initialisation, where compiling a kernel would cost more than it saves. The value is laid out
    as compiled kernels' outputs are (runtime.executor.allocate), so that an optimizer's first
    update can be written over it (runtime/donation.py). A value on a device is computed there."""
    if node.device in DEVICE_BACKENDS:
        realize([node])
    elif node.buffer is None:
        from metagraph.runtime.executor import allocate
        value = _numpy().realize([node])[0]
        out = allocate(node.shape, node.dtype.np)
        out[...] = value
        node.set_buffer(out)


def realize(nodes):
    """Compute every node in `nodes` that has no buffer yet; afterwards each holds its buffer."""
    if _deferred:
        updated = [ref() for ref in _deferred.values()]
        _deferred.clear()
        nodes = list(nodes) + [t.node for t in updated if t is not None]
    if len(nodes) == 1:
        pending = nodes if nodes[0].buffer is None else ()
    else:
        pending = [node for node in nodes if node.buffer is None]
        if len(pending) > 1:
            pending = list({node.id: node for node in pending}.values())     # each node once
    if not pending:
        return
    if _active is None:
        get_backend()
    if PENDING_COPIES:
        _make_copies(pending)
    elif len(pending) == 1 and pending[0].device not in DEVICE_BACKENDS and not flags.DEBUG:
        pending[0].set_buffer(_active.realize(pending)[0])      # (the most common call: one value)
        return
    groups = {}         # by the backend of their device (None: the active one)
    for node in pending:
        if node.buffer is None:
            groups.setdefault(DEVICE_BACKENDS.get(node.device), []).append(node)
    for name, group in groups.items():
        computing = _active if name is None else _instance(name)
        if flags.DEBUG:
            print(f"metagraph: realise {len(group)} node(s) on {computing.name}", file=sys.stderr)
        for node, array in zip(group, computing.realize(group)):
            node.set_buffer(array)


def to_device(node, device):
    """`node`'s value on `device` (a device name): the node itself if it is there, else a copy node,
    moved at once (a transfer) when the value is known, else when it is computed."""
    if node.device is device or (node.device is None and device is CPU_NAME):
        return node
    moved = copy(node, device)
    if node.buffer is not None:
        moved.set_buffer(_moved(node.buffer, device))
        PENDING_COPIES.pop(moved.id, None)
    return moved


def _moved(buffer, device):
    """A realised value moved to `device`: a host array uploaded to a device, or a device's array
    copied back to the host."""
    if device is CPU_NAME:
        return np.asarray(buffer)
    return _instance(DEVICE_BACKENDS[device]).generator.device.upload(buffer)


def _make_copies(nodes):
    """Make the copy nodes without a value that `nodes` depend on: each one's input is computed on
    its own device, then moved."""
    stack, seen = list(nodes), set()
    while stack:
        node = stack.pop()
        if node.buffer is not None or node.id in seen:
            continue
        seen.add(node.id)
        if node.op != "copy":
            stack.extend(node.inputs)
            continue
        source = node.inputs[0]
        realize([source])
        node.set_buffer(_moved(source.buffer, node.device))
        PENDING_COPIES.pop(node.id, None)


def empty_cache():
    """Give the free buffers that the host's and the devices' pools keep for reuse back (to malloc,
    and so to the operating system, or to the device's driver)."""
    from metagraph.runtime import executor
    executor.empty_cache()
    for name in DEVICE_BACKENDS.values():
        if name in _instances:
            _instances[name].generator.device.empty_cache()
