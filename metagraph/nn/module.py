"""Module and Parameter, as in PyTorch: attributes register parameters, buffers and children."""
from collections import OrderedDict

import numpy as np

from metagraph import backend, dtypes
from metagraph.creation import tensor as as_tensor
from metagraph.errors import MetagraphError, ShapeError
from metagraph.tensor import Tensor


def realize_on_host(tensor):
    """Compute an initial value now on the host (cheap work: nothing is compiled for it)."""
    backend.realize_on_host(tensor.node)
    return tensor


class Parameter(Tensor):
    """A Tensor that a Module trains: a leaf that requires grad (unless told otherwise).

    Its initial value is computed at once on the host, so that a model never recomputes its
    initialisation and no kernel is compiled for it."""
    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        if not isinstance(data, Tensor):        # an array or nested lists, as mg.tensor takes
            data = as_tensor(data)
        super().__init__(data.node)
        realize_on_host(self)
        self.requires_grad_(requires_grad and self.dtype.is_float)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of every layer and model: override forward()."""
    training = True

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration ------------------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise MetagraphError(f"{type(self).__name__}: call super().__init__() before setting {name!r}")
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Tensor) and name in self.__dict__.get("_buffer_names", ()):
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name, tensor, persistent=True):
        """A tensor that is state but not trained (BatchNorm's running statistics)."""
        names = self.__dict__.setdefault("_buffer_names", set())
        names.add(name)
        if not persistent:
            self.__dict__.setdefault("_non_persistent", set()).add(name)
        self._buffers[name] = tensor

    def register_parameter(self, name, parameter):
        if parameter is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
        else:
            self._parameters[name] = parameter

    def add_module(self, name, module):
        self._modules[name] = module

    # ---- calling -----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal ---------------------------------------------------------------------------
    def named_modules(self, prefix="", memo=None):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self):
        for _, child in self.named_children():
            yield child

    def named_parameters(self, prefix="", recurse=True):
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, parameter in module._parameters.items():
                if parameter is not None and id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield (f"{module_prefix}.{name}" if module_prefix else name), parameter

    def parameters(self, recurse=True):
        for _, parameter in self.named_parameters(recurse=recurse):
            yield parameter

    def named_buffers(self, prefix="", recurse=True):
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    yield (f"{module_prefix}.{name}" if module_prefix else name), buffer

    def buffers(self, recurse=True):
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def apply(self, fn):
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ---- modes and gradients ----------------------------------------------------------------
    def train(self, mode=True):
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for parameter in self.parameters():
            parameter.grad = None

    def requires_grad_(self, requires_grad=True):
        for parameter in self.parameters():
            parameter.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs):
        """Devices: everything lives on the host. Dtypes: float parameters and buffers are converted."""
        dtype = kwargs.get("dtype") or next((a for a in args if not isinstance(a, str)), None)
        if dtype is not None:
            for tensor in list(self.parameters()) + list(self.buffers()):
                if tensor.dtype.is_float:
                    tensor.data = tensor.to(dtype)
        return self

    def double(self):
        return self.to(dtypes.float64)

    def float(self):
        return self.to(dtypes.float32)

    def half(self):
        return self.to(dtypes.float16)

    def cpu(self):
        return self

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self, prefix=""):
        """Parameters and persistent buffers by dotted name, in registration order (as PyTorch)."""
        state = OrderedDict()
        for module_prefix, module in self.named_modules(prefix):
            skip = module.__dict__.get("_non_persistent", set())
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    if tensor is not None and name not in skip:
                        state[f"{module_prefix}.{name}" if module_prefix else name] = tensor.detach()
        return state

    def load_state_dict(self, state_dict, strict=True):
        """Copy values into parameters and buffers; keys and shapes are checked, errors name the key."""
        own = OrderedDict()
        for module_prefix, module in self.named_modules():
            skip = module.__dict__.get("_non_persistent", set())
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    if tensor is not None and name not in skip:
                        own[f"{module_prefix}.{name}" if module_prefix else name] = tensor
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise MetagraphError(f"load_state_dict for {type(self).__name__}: missing keys {missing}, "
                                 f"unexpected keys {unexpected}")
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(array.shape) != target.shape:
                raise ShapeError(f"load_state_dict for {type(self).__name__}: {key!r} has shape "
                                 f"{tuple(array.shape)} in the checkpoint but {target.shape} in the model")
            from metagraph.creation import from_numpy_array
            target.assign(from_numpy_array(array, target.dtype))
        return missing, unexpected

    # ---- printing -----------------------------------------------------------------------------
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        for name, child in self._modules.items():
            text = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {text}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = "\n  ".join(([extra] if extra else []) + lines)
        return f"{type(self).__name__}(\n  {body}\n)"


