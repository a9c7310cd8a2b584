"""mg.save and mg.load: state dicts (and nested dicts/lists of tensors) in a zip checkpoint, and
PyTorch's .pth checkpoints read without PyTorch.

Both formats are a zip holding data.pkl (the structure) and data/<key> (raw tensor bytes).
Pickles are loaded only through an allow-list: OrderedDict and PyTorch's tensor-rebuilding
functions and storage types; anything else is refused, so a malicious checkpoint cannot run code.
Writes go to a temporary file that is renamed, so an interrupted save leaves no half-written file."""
import io
import os
import pickle
import tempfile
import zipfile
from collections import OrderedDict

import numpy as np

from metagraph import dtypes
from metagraph.creation import from_numpy_array
from metagraph.errors import MetagraphError
from metagraph.tensor import Tensor

_TORCH_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                   "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
                   "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}
_ROOT = "metagraph_checkpoint"


class CheckpointError(MetagraphError, pickle.UnpicklingError):
    """A checkpoint that cannot, or must not, be loaded."""


class _StorageType:
    def __init__(self, name):
        self.dtype = np.dtype(_TORCH_STORAGES[name])


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    itemsize = storage.dtype.itemsize
    array = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                            strides=tuple(s * itemsize for s in stride))
    return from_numpy_array(np.array(array))


def _rebuild_parameter(data, requires_grad=True, hooks=None):
    return data


_ALLOWED = {("collections", "OrderedDict"): OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream, archive, prefix, path):
        super().__init__(stream)
        self.archive, self.prefix, self.path = archive, prefix, path

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _TORCH_STORAGES:
            return _StorageType(name)
        raise CheckpointError(f"mg.load: {self.path} asks for {module}.{name}, which is not on the "
                              "allow-list "
                              "(tensors, dicts, lists and numbers only); refusing to load it")

    def _read(self, key):
        try:
            return self.archive.read(f"{self.prefix}data/{key}")
        except KeyError:
            raise CheckpointError(f"mg.load: {self.path} lacks the data of tensor {key}") from None

    def persistent_load(self, pid):
        if pid[0] == "storage":                      # PyTorch: ('storage', type, key, location, numel)
            _, storage_type, key, _, numel = pid
            data = np.frombuffer(self._read(key), dtype=storage_type.dtype)
            if len(data) < numel:
                raise CheckpointError(f"mg.load: tensor data {key} in {self.path} is truncated")
            return data
        if pid[0] == "metagraph":                    # ours: ('metagraph', dtype, shape, key)
            _, dtype, shape, key = pid
            array = np.frombuffer(self._read(key), dtype=dtypes.as_dtype(dtype).np)
            if array.size != int(np.prod(shape)):
                raise CheckpointError(f"mg.load: tensor data {key} in {self.path} has the wrong size")
            return from_numpy_array(array.reshape(shape))
        raise CheckpointError(f"mg.load: {self.path} holds an unknown kind of object {pid[0]!r}")


def load(path):
    """Read a checkpoint written by mg.save or by torch.save (zip format)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"mg.load: {path} is not a zip checkpoint ({error}); legacy PyTorch "
                              "checkpoints (before 1.6) are not supported") from None
    with archive:
        names = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if not names:
            raise CheckpointError(f"mg.load: {path} holds no data.pkl")
        prefix = names[0][:-len("data.pkl")]
        order = f"{prefix}byteorder"
        if order in archive.namelist() and archive.read(order).strip() != b"little":
            raise CheckpointError(f"mg.load: {path} was written on a big-endian machine")
        stream = io.BytesIO(archive.read(names[0]))
        try:
            return _Unpickler(stream, archive, prefix, path).load()
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(f"mg.load: {path} is damaged: {error}") from None


class _Pickler(pickle.Pickler):
    def __init__(self, stream, blobs):
        super().__init__(stream, protocol=2)
        self.blobs = blobs

    def persistent_id(self, obj):
        if isinstance(obj, Tensor):
            array = np.ascontiguousarray(obj.numpy())
            key = str(len(self.blobs))
            self.blobs.append(array.tobytes())
            return ("metagraph", obj.dtype.name, tuple(array.shape), key)
        return None


def save(obj, path):
    """Write obj (a state dict, or dicts/lists/tuples of tensors and numbers) to path, atomically."""
    blobs, structure = [], io.BytesIO()
    _Pickler(structure, blobs).dump(obj)
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".ckpt")
    os.close(fd)
    try:
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(f"{_ROOT}/data.pkl", structure.getvalue())
            archive.writestr(f"{_ROOT}/byteorder", "little")
            for key, blob in enumerate(blobs):
                archive.writestr(f"{_ROOT}/data/{key}", blob)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
