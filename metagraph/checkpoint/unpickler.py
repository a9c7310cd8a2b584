"""The unpickler both checkpoint formats read through. Globals come only from an allow-list
(OrderedDict, and PyTorch's tensor-rebuilding functions, storage classes and dtypes, each a
metagraph stand-in), so a malicious checkpoint cannot run code; every persistent id is checked."""
import math
import pickle
from collections import OrderedDict

from metagraph.checkpoint.names import (STORAGE_OF, STORAGE_TYPES, UNTYPED_STORAGE, V3_DTYPES, StorageType,
                                        TorchFunction, refuse)
from metagraph.checkpoint.tensors import (PendingTensor, Storage, contiguous_strides, counts, is_count,
                                          rebuild_parameter, rebuild_tensor_v2, rebuild_tensor_v3)

GLOBALS = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): TorchFunction("torch._utils", "_rebuild_tensor_v2",
                                                          rebuild_tensor_v2),
    ("torch._utils", "_rebuild_tensor_v3"): TorchFunction("torch._utils", "_rebuild_tensor_v3",
                                                          rebuild_tensor_v3),
    ("torch._utils", "_rebuild_parameter"): TorchFunction("torch._utils", "_rebuild_parameter",
                                                          rebuild_parameter),
    ("torch._utils", "_rebuild_parameter_with_state"): TorchFunction(
        "torch._utils", "_rebuild_parameter_with_state", rebuild_parameter),
    ("torch", "UntypedStorage"): UNTYPED_STORAGE,
    ("torch.storage", "UntypedStorage"): UNTYPED_STORAGE,
    **{("torch", name): kind for name, kind in STORAGE_TYPES.items()},
    **{("torch", name): dtype for name, dtype in V3_DTYPES.items()},
}

# Rebuilding functions of kinds of tensor metagraph does not load: refused by what they build.
_OTHER_TENSORS = {"_rebuild_qtensor": "quantized tensors", "_rebuild_sparse_tensor": "sparse tensors",
                  "_rebuild_nested_tensor": "nested tensors",
                  "_rebuild_wrapper_subclass": "tensor subclasses",
                  "_rebuild_meta_tensor_no_storage": "tensors without data (meta tensors)"}


class Unpickler(pickle.Unpickler):
    """Reads one pickle of a checkpoint; `storages` collects the storages its tensors name, by key."""

    def __init__(self, stream, path):
        super().__init__(stream)
        self.path = path
        self.storages = {}

    def find_class(self, module, name):
        if (module, name) in GLOBALS:
            return GLOBALS[module, name]
        if module == "torch._utils" and name in _OTHER_TENSORS:
            refuse(self.path, f"holds {_OTHER_TENSORS[name]} ({module}.{name}), which metagraph does not "
                              "load")
        refuse(self.path, f"asks for {module}.{name}, which is not on the allow-list (tensors, dicts, lists "
                          "and numbers only); refusing to load it")

    def persistent_load(self, pid):
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        if kind == "storage" and len(pid) in (5, 6):
            # ('storage', storage class, key, location, element count[, view: legacy format only])
            if len(pid) == 6 and pid[5] is not None:
                refuse(self.path, "holds a storage view, which only PyTorch before 1.0 wrote; metagraph "
                                  "does not read it")
            return self.storage(pid[1], pid[2], pid[4])
        if kind == "metagraph" and len(pid) == 4:
            return self.old_metagraph_tensor(*pid[1:])
        if kind == "module":
            refuse(self.path, "holds a whole nn.Module (torch.save(model)); save model.state_dict() instead")
        refuse(self.path, f"holds an unknown kind of object {str(pid)[:80]}")

    def storage(self, kind, key, numel):
        """The storage `key`: the same object for every tensor over it, which must agree on its size."""
        if not isinstance(kind, StorageType) or type(key) is not str or not is_count(numel):
            refuse(self.path, f"names a storage as ({kind!r}, {str(key)[:40]!r}, {str(numel)[:40]}); "
                              "expected a storage class, a string key and an element count >= 0")
        known = self.storages.setdefault(key, Storage(key, kind, numel))
        if known.type is not kind or known.numel != numel:
            refuse(self.path, f"names storage {key!r} both as {known.numel} {known.type.dtype} elements "
                              f"and as {numel} {kind.dtype} elements")
        return known

    def old_metagraph_tensor(self, dtype, shape, key):
        """A tensor as mg.save wrote them before it wrote PyTorch's format: ('metagraph', dtype name,
        shape, key), over all of its contiguous storage."""
        size = counts(shape)
        if dtype not in STORAGE_OF or size is None:
            refuse(self.path, f"holds a tensor of dtype {str(dtype)[:40]} and shape {str(shape)[:80]}; "
                              "expected a metagraph dtype and a tuple of integers >= 0")
        storage = self.storage(STORAGE_OF[dtype], key, math.prod(size))
        return PendingTensor(storage, 0, size, contiguous_strides(size))
