"""PyTorch's legacy checkpoint format, which torch.save still writes when asked
(`_use_new_zipfile_serialization=False`): one file holding, in order,

  three pickles: the magic number 0x1950a86a20f9469cfc6c, the protocol version 1001, system info
  the object's pickle, whose persistent ids ('storage', torch.FloatStorage, key, location,
      element count, None) name its storages
  a pickle of the list of storage keys
  then for each key of that list: the element count (int64) and the raw elements, little-endian
      whatever the machine (torch/csrc/serialization.cpp converts on big-endian ones)

The tar format of PyTorch's first releases is refused."""
import os
import struct

from metagraph.checkpoint.names import refuse
from metagraph.checkpoint.tensors import materialize
from metagraph.checkpoint.unpickler import Unpickler

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


def read(file, path):
    """The object in the legacy checkpoint `file` (opened from `path`), its tensors checked and built."""
    if file.read(512)[257:262] == b"ustar":
        refuse(path, "is a PyTorch checkpoint in the tar format of PyTorch's first releases, which "
                     "metagraph does not read; load it with torch.load and save it again")
    file.seek(0)
    try:
        magic = Unpickler(file, path).load()
    except Exception:       # whatever the file holds, it does not start as a checkpoint does
        magic = None
    if type(magic) is not int or magic != MAGIC_NUMBER:
        refuse(path, "is not a checkpoint: neither a zip file (torch.save, mg.save) nor PyTorch's legacy "
                     "format")
    version = Unpickler(file, path).load()
    if version != PROTOCOL_VERSION:
        refuse(path, f"has legacy protocol version {str(version)[:20]}; expected {PROTOCOL_VERSION}")
    Unpickler(file, path).load()     # system info: the format fixes the byte order and sizes anyway
    unpickler = Unpickler(file, path)
    obj = unpickler.load()
    keys, storages = Unpickler(file, path).load(), unpickler.storages
    if not isinstance(keys, list) or len(keys) != len(storages) or set(keys) != set(storages):
        refuse(path, f"lists storage keys {str(keys)[:100]}, but its tensors use the {len(storages)} "
                     f"storages {str(sorted(storages))[:100]}")
    end = os.fstat(file.fileno()).st_size
    for key in keys:
        storage = storages[key]
        (numel,) = struct.unpack("<q", _read(file, 8, end, path, storage))
        if numel != storage.numel:
            refuse(path, f"holds {numel} elements for {storage!r}, which its pickle declares as "
                         f"{storage.numel} {storage.type.dtype} elements")
        data = _read(file, storage.nbytes, end, path, storage)
        if storage.type.supported:      # the others' tensors are refused, naming their keys
            storage.fill(data, "<")
    return materialize(obj, path)


def _read(file, size, end, path, storage):
    """Exactly `size` bytes, checked against the file's length before anything is allocated."""
    if file.tell() + size > end:
        refuse(path, f"is truncated: {storage!r} needs {size} bytes at offset {file.tell()}, past the "
                     f"end of the file ({end} bytes)")
    return file.read(size)
