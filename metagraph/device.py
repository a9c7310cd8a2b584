"""Devices: where a tensor's value lives, and so which backend computes it.

"cpu" is host memory, computed by the active backend (`mg.set_backend`: c, llvm, bang or numpy by
default; with "opencl", the OpenCL device computes the cpu's values too and copies them back).
"opencl" is an OpenCL device's memory, computed by the `opencl` backend whatever the active one
is; its values stay there until `.numpy()`, `.item()` or `.cpu()` copies them to the host. A node
records its device by name (`Node.device`); a constant has none and goes with what reads it.
"""
from metagraph.errors import ArgumentError

CPU_NAME, OPENCL_NAME = "cpu", "opencl"
NAMES = {CPU_NAME: CPU_NAME, OPENCL_NAME: OPENCL_NAME}    # one string object per name: nodes compare by `is`


class device:
    """PyTorch's torch.device: "cpu" or "opencl" (an index, if given, must be 0: one device each)."""
    __slots__ = ("type", "index")

    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        kind, _, number = str(spec).partition(":")
        if kind not in NAMES:
            raise ArgumentError(f"device {spec!r} is not available: metagraph computes on 'cpu' and "
                                "'opencl'")
        self.type = NAMES[kind]
        self.index = int(number) if number else index
        if self.index not in (None, 0):
            raise ArgumentError(f"device {spec!r} is not available: there is one {kind} device, index 0")

    def __eq__(self, other):
        if isinstance(other, str):
            return self.type == other.partition(":")[0]
        return isinstance(other, device) and self.type == other.type

    def __hash__(self):
        return hash(self.type)

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


CPU = device(CPU_NAME)
OPENCL = device(OPENCL_NAME)
_OBJECTS = {None: CPU, CPU_NAME: CPU, OPENCL_NAME: OPENCL}


def check(spec):
    """The device for a `device=` argument (None is the CPU); an error for a device that is not
    available."""
    return CPU if spec is None else device(spec)


def name(spec):
    """The device name a node records for a `device=` argument (None: "cpu")."""
    return CPU_NAME if spec is None else device(spec).type


def of(node):
    """The device object of a node's value (a constant's, which has none, is the CPU)."""
    return _OBJECTS[node.device]
