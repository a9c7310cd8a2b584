"""Which backend realises graphs, and the one call through which every value is computed."""
import sys
import warnings
import weakref

from metagraph import flags
from metagraph.errors import MetagraphError

_active = None
_instances = {}  # name -> backend made once (a backend holds its loaded kernels and schedules)
_deferred = {}   # id -> weak reference of tensors updated in place, computed at the next realisation
                 # (by identity: a WeakSet would compare tensors with their element-wise ==)


def _numpy():
    from metagraph.codegen.interpreter import NumpyBackend
    return NumpyBackend()


def _c():
    from metagraph.codegen.c import CBackend
    return CBackend()


def _llvm():
    from metagraph.codegen.llvm import LLVMBackend
    return LLVMBackend()


def _bang():
    from metagraph.codegen.bang import BangBackend
    return BangBackend()


BACKENDS = {"c": _c, "llvm": _llvm, "bang": _bang, "numpy": _numpy}
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
    initialisation, where compiling a kernel would cost more than it saves."""
    if node.buffer is None:
        node.set_buffer(_numpy().realize([node])[0])


def realize(nodes):
    """Compute every node in `nodes` that has no buffer yet; afterwards each holds its buffer."""
    if _deferred:
        updated = [ref() for ref in _deferred.values()]
        _deferred.clear()
        nodes = list(nodes) + [t.node for t in updated if t is not None]
    pending = [node for node in nodes if node.buffer is None]
    if len(pending) > 1:
        pending = list({node.id: node for node in pending}.values())     # each node once
    if not pending:
        return
    get_backend()
    if flags.DEBUG:
        print(f"metagraph: realise {len(pending)} node(s) on {_active.name}", file=sys.stderr)
    for node, array in zip(pending, _active.realize(pending)):
        node.set_buffer(array)
