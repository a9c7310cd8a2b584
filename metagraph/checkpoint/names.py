"""The globals of PyTorch's checkpoint pickles that metagraph stands in for, without importing torch.

A stand-in is what the unpickler hands out for `module.name`, and what the pickler writes back as
that same global, so what mg.save writes names what torch.load expects, and mg.load reads it."""
import pickle

from metagraph import dtypes
from metagraph.errors import MetagraphError, fail


class CheckpointError(MetagraphError, pickle.UnpicklingError):
    """A checkpoint that cannot, or must not, be loaded."""


def refuse(path, message):
    """Raise a CheckpointError about the checkpoint at `path`, naming the user's line."""
    fail(CheckpointError, "mg.load", f"{path} {message}")


def refuse_build(self, state):
    """__setstate__ of every object the unpickler hands out: a pickle's BUILD opcode would otherwise
    let a checkpoint rewrite a shared stand-in, or a tensor's size after it was recorded. (mg.load
    turns the error into a CheckpointError naming the file.)"""
    raise pickle.UnpicklingError(f"the pickle tried to modify {self!r}")


class TorchName:
    """A global of PyTorch's pickles, `module.name`, that metagraph provides itself."""

    __setstate__ = refuse_build

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __repr__(self):
        return f"{self.module}.{self.name}"


class TorchFunction(TorchName):
    """A function of PyTorch's pickles (torch._utils._rebuild_tensor_v2 ...) that metagraph implements."""

    def __init__(self, module, name, function):
        super().__init__(module, name)
        self.function = function

    def __call__(self, *args):
        return self.function(*args)


class StorageType(TorchName):
    """A storage class (torch.FloatStorage ...): the element type of the storages it names."""

    def __init__(self, module, name, dtype, itemsize):
        super().__init__(module, name)
        self.dtype, self.itemsize = dtype, itemsize

    @property
    def supported(self):
        return self.dtype in SUPPORTED


SUPPORTED = {dtype.name for dtype in dtypes.ALL}

# The storage classes torch.save names (torch/storage.py, _dtype_to_storage_type_map), quantized
# ones aside: those come with torch._utils._rebuild_qtensor, which is refused by name.
STORAGE_TYPES = {name: StorageType("torch", name, dtype, itemsize) for name, dtype, itemsize in [
    ("FloatStorage", "float32", 4), ("DoubleStorage", "float64", 8), ("HalfStorage", "float16", 2),
    ("LongStorage", "int64", 8), ("IntStorage", "int32", 4), ("ShortStorage", "int16", 2),
    ("CharStorage", "int8", 1), ("ByteStorage", "uint8", 1), ("BoolStorage", "bool", 1),
    ("BFloat16Storage", "bfloat16", 2), ("ComplexFloatStorage", "complex64", 8),
    ("ComplexDoubleStorage", "complex128", 16)]}

# Bytes: torch.load reads a tensor over one as uint8, unless _rebuild_tensor_v3 gives it a dtype.
UNTYPED_STORAGE = StorageType("torch.storage", "UntypedStorage", "uint8", 1)

# The storage class of each metagraph dtype, which mg.save writes.
STORAGE_OF = {kind.dtype: kind for kind in STORAGE_TYPES.values() if kind.supported}

# The dtypes torch.save writes through _rebuild_tensor_v3 over an UntypedStorage (torch/storage.py,
# _new_dtypes); metagraph has none of them.
V3_DTYPES = {name: TorchName("torch", name) for name in [
    "uint16", "uint32", "uint64", "complex32", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
    "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4",
    "bits4x2"]}
