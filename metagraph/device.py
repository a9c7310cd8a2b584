"""Devices: all data lives on the host, so the one device is the CPU (`device("cpu")`)."""
from metagraph.errors import ArgumentError


class device:
    """PyTorch's torch.device, for "cpu" (or "cpu:0") only: any other device is an error."""
    __slots__ = ("type", "index")

    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        kind, _, number = str(spec).partition(":")
        if kind != "cpu":
            raise ArgumentError(f"device {spec!r} is not available: metagraph computes on the CPU "
                                "only (use 'cpu')")
        self.type = "cpu"
        self.index = int(number) if number else index

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


CPU = device("cpu")


def check(spec):
    """The device for a `device=` argument (None is the CPU); an error for any other device."""
    return CPU if spec is None else device(spec)
