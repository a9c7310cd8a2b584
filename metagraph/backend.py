"""Which backend realises graphs, and the one call through which every value is computed."""
import sys

from metagraph import flags
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.errors import MetagraphError

BACKENDS = {"numpy": NumpyBackend}
_active = None


def set_backend(name):
    """Make `name` the backend that realises every later computation."""
    global _active
    if name not in BACKENDS:
        raise MetagraphError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    _active = BACKENDS[name]()


def get_backend():
    """The name of the active backend."""
    if _active is None:
        set_backend(flags.BACKEND or "numpy")
    return _active.name


def realize(nodes):
    """Compute every node in `nodes` that has no buffer yet; afterwards each holds its buffer."""
    pending = list({node.id: node for node in nodes if node.buffer is None}.values())
    if not pending:
        return
    get_backend()
    if flags.DEBUG:
        print(f"metagraph: realise {len(pending)} node(s) on {_active.name}: "
              f"{', '.join(map(repr, pending[:4]))}", file=sys.stderr)
    for node, array in zip(pending, _active.realize(pending)):
        node.set_buffer(array)
