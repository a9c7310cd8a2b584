"""PyTorch's zip checkpoint format (torch.save since PyTorch 1.6): mg.load reads it, mg.save writes it.

  <folder>/data.pkl     the object, pickled (protocol 2); a tensor is torch._utils._rebuild_tensor_v2
                        over a storage named by the persistent id
                        ('storage', torch.FloatStorage, key, 'cpu', element count)
  <folder>/byteorder    'little' or 'big': the order of the bytes below
  <folder>/data/<key>   each storage's elements, raw
  <folder>/version      the format version; torch.load requires it ('3\\n', as torch.save writes)

mg.save writes no .format_version record: with one, torch.load may compute where records start
from the layout of its own zip writer (miniz), which Python's zipfile does not reproduce, instead
of reading each record's offset."""
import io
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict

from metagraph.checkpoint.names import STORAGE_OF, StorageType, TorchFunction, TorchName, refuse
from metagraph.checkpoint.tensors import contiguous_strides, materialize
from metagraph.checkpoint.unpickler import GLOBALS, Unpickler
from metagraph.errors import ArgumentError, fail
from metagraph.tensor import Tensor

_FOLDER = "archive"
_ALIGNMENT = 64          # torch.save starts every record at a multiple of 64 bytes, for mmap
_PADDING_FIELD = 0x4246  # the zip extra field torch.save pads with ('FB')
_REBUILD_TENSOR = GLOBALS["torch._utils", "_rebuild_tensor_v2"]
_PLAIN = (dict, OrderedDict, list, tuple, str, int, float, bool, type(None))


def read(file, path):
    """The object in the zip checkpoint `file` (opened from `path`), its tensors checked and built."""
    with zipfile.ZipFile(file) as archive:
        names = set(archive.namelist())
        pickles = [name for name in archive.namelist() if name.split("/")[-1] == "data.pkl"
                   and name.count("/") <= 1]
        if not pickles:
            refuse(path, "is a zip file but not a checkpoint: it holds no data.pkl")
        prefix = pickles[0][:-len("data.pkl")]
        if f"{prefix}constants.pkl" in names:
            refuse(path, "is a TorchScript archive (torch.jit.save), not a checkpoint; metagraph does not "
                         "load it")
        order = archive.read(f"{prefix}byteorder") if f"{prefix}byteorder" in names else b"little"
        if order not in (b"little", b"big"):
            refuse(path, f"names the byte order {order[:20]!r}; expected b'little' or b'big'")
        unpickler = Unpickler(io.BytesIO(archive.read(pickles[0])), path)
        obj = unpickler.load()
        for storage in unpickler.storages.values():
            record = f"{prefix}data/{storage.key}"
            if record not in names:
                refuse(path, f"lacks the data of {storage!r} (no record {record})")
            size = archive.getinfo(record).file_size
            if size != storage.nbytes:
                refuse(path, f"holds {size} bytes for {storage!r}, which its pickle declares as "
                             f"{storage.numel} {storage.type.dtype} elements ({storage.nbytes} bytes)")
            if storage.type.supported:      # the others' tensors are refused, naming their keys
                storage.fill(archive.read(record), "<" if order == b"little" else ">")
    return materialize(obj, path)


def encode(obj):
    """obj pickled as torch.save pickles it, and its tensors' values: record i holds arrays[i]."""
    stream = io.BytesIO()
    pickler = _Pickler(stream)
    pickler.dump(obj)
    return stream.getvalue(), pickler.arrays


def write(file, pickled, arrays):
    """Write a zip checkpoint to the binary file `file`; torch.load(weights_only=True) reads it."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:
        _write_record(archive, file, "data.pkl", pickled)
        _write_record(archive, file, "byteorder", sys.byteorder.encode())
        for key, values in enumerate(arrays):
            _write_record(archive, file, f"data/{key}", values.tobytes())
        _write_record(archive, file, "version", b"3\n")


def _write_record(archive, file, name, data):
    # A fixed date: the same object always gives the same bytes.
    info = zipfile.ZipInfo(f"{_FOLDER}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
    # Pad the local header (30 bytes, the name, the padding field's own 4) so that the data starts
    # aligned. A record over 2 GB gets a zip64 field too and is then unaligned, which torch.load accepts.
    padding = -(file.tell() + 30 + len(info.filename) + 4) % _ALIGNMENT
    info.extra = struct.pack("<HH", _PADDING_FIELD, padding) + bytes(padding)
    archive.writestr(info, data)


class _Record:
    """A storage record that mg.save writes: pickled as its persistent id, as torch.save does."""

    def __init__(self, kind, key, numel):
        self.kind, self.key, self.numel = kind, key, numel


class _Pickler(pickle._Pickler):
    """Pickles as torch.save does. The Python pickler, because only it lets a stand-in be written as
    the global it stands for (torch.FloatStorage ...): the C pickler imports every global it writes."""

    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, stream):
        super().__init__(stream, protocol=2)
        self.arrays = []

    def persistent_id(self, obj):
        if isinstance(obj, _Record):
            return ("storage", obj.kind, obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            values = obj.numpy()
            record = _Record(STORAGE_OF[obj.dtype.name], str(len(self.arrays)), values.size)
            self.arrays.append(values)
            return _REBUILD_TENSOR, (record, 0, values.shape, contiguous_strides(values.shape), False,
                                     OrderedDict())
        if type(obj) in _PLAIN or obj is OrderedDict or isinstance(obj, TorchName):
            return NotImplemented
        # Anything else would make a checkpoint that mg.load (and torch.load(weights_only=True)) refuses.
        fail(ArgumentError, "mg.save", f"cannot store a {type(obj).__module__}.{type(obj).__qualname__}: "
                                       "a checkpoint holds tensors, numbers, strings, None, and dicts, "
                                       "lists and tuples of them")

    def save_torch_name(self, name):
        """Write a stand-in as the global it stands for, as the pickler writes a class or function."""
        self.write(pickle.GLOBAL + f"{name.module}\n{name.name}\n".encode("ascii"))
        self.memoize(name)


_Pickler.dispatch.update(dict.fromkeys((TorchName, TorchFunction, StorageType), _Pickler.save_torch_name))
