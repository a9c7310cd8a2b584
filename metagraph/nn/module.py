"""Module and Parameter, as in PyTorch: attributes register parameters, buffers and children;
forward hooks see (and may replace) a call's arguments and result."""
import copy
import warnings
from collections import OrderedDict

import numpy as np

from metagraph import backend, dtypes
from metagraph.creation import tensor as as_tensor
from metagraph.device import device
from metagraph.errors import DTypeError, MetagraphError, ShapeError
from metagraph.grad import no_grad
from metagraph.hooks import RemovableHandle
from metagraph.nn.backward_hooks import BackwardHookCall
from metagraph.ops.node import GradMode
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


_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks",
                "_backward_pre_hooks")


class Module:
    """Base class of every layer and model: override forward()."""
    training = True

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        for table in _HOOK_TABLES:      # PyTorch's names: scripts clear them to drop every hook
            object.__setattr__(self, table, OrderedDict())

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
        """A tensor that is state but not trained (BatchNorm's running statistics), or None; a buffer
        that is not persistent stays out of state_dict()."""
        if not isinstance(name, str):
            raise TypeError(f"register_buffer: the buffer name should be a string, got {type(name).__name__}")
        if "." in name or not name:
            raise KeyError(f"register_buffer: the buffer name {name!r} is empty or contains '.'")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"register_buffer: attribute {name!r} already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: cannot assign a {type(tensor).__name__} to buffer {name!r} "
                            "(a Tensor or None is required)")
        self.__dict__.setdefault("_buffer_names", set()).add(name)
        non_persistent = self.__dict__.setdefault("_non_persistent", set())
        if persistent:
            non_persistent.discard(name)
        else:
            non_persistent.add(name)
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
        if (self._forward_pre_hooks or self._forward_hooks or self._backward_hooks
                or self._backward_pre_hooks):
            return self._call_with_hooks(args, kwargs)
        return self.forward(*args, **kwargs)

    def _call_with_hooks(self, args, kwargs):
        """PyTorch's order: pre-hooks may replace the arguments, then (with backward hooks) the tensor
        arguments are wrapped, then forward, then forward hooks may replace the result, which (with
        backward hooks) is wrapped. If anything raises, the always_call hooks not yet run are run (their own
        errors become warnings) and the error propagates. A hook removed by another still runs in this
        call, as in PyTorch (each table is read once)."""
        result, called = None, set()
        try:
            for hook_id, hook in tuple(self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    replaced = hook(self, args, kwargs)
                    if replaced is not None:
                        if not (isinstance(replaced, tuple) and len(replaced) == 2):
                            raise MetagraphError(f"{type(self).__name__}: a forward pre-hook with kwargs "
                                                 "must return None or a tuple (args, kwargs), got "
                                                 f"{replaced!r}")
                        args, kwargs = replaced
                else:
                    replaced = hook(self, args)
                    if replaced is not None:
                        args = replaced if isinstance(replaced, tuple) else (replaced,)
            backward = None
            if (self._backward_hooks or self._backward_pre_hooks) and GradMode.enabled:
                backward = BackwardHookCall(self, args)
                args = backward.wrap_inputs(args)
            result = self.forward(*args, **kwargs)
            for hook_id, hook in tuple(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called:
                    called.add(hook_id)
                replaced = self._run_forward_hook(hook_id, hook, args, kwargs, result)
                if replaced is not None:
                    result = replaced
            return result if backward is None else backward.wrap_outputs(result)
        except Exception:
            for hook_id, hook in tuple(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called and hook_id not in called:
                    try:
                        self._run_forward_hook(hook_id, hook, args, kwargs, result)
                    except Exception as error:
                        warnings.warn("module forward hook with always_call=True raised an exception that "
                                      f"was silenced as another error was raised in forward: {error}",
                                      stacklevel=3)
            raise

    def _run_forward_hook(self, hook_id, hook, args, kwargs, result):
        if hook_id in self._forward_hooks_with_kwargs:
            return hook(self, args, kwargs, result)
        return hook(self, args, result)

    # ---- hooks ---------------------------------------------------------------------------------
    @staticmethod
    def _add_hook(hooks, hook, prepend, flags):
        """Register `hook` in `hooks` (first if prepend), marked in each table of `flags` whose value
        is true; the handle removes it from all of them."""
        handle = RemovableHandle(hooks, [table for table, _ in flags])
        hooks[handle.id] = hook
        for table, flag in flags:
            if flag:
                table[handle.id] = True
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """Call hook(module, args) before forward (hook(module, args, kwargs) with_kwargs); a result that
        is not None replaces the arguments: a tuple, a single value (wrapped in one), or with_kwargs an
        (args, kwargs) pair. Returns a handle whose remove() unregisters the hook."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend,
                              [(self._forward_pre_hooks_with_kwargs, with_kwargs)])

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """Call hook(module, args, output) after forward (hook(module, args, kwargs, output) with_kwargs);
        a result that is not None replaces the output. always_call: run it even when forward raises.
        Returns a handle whose remove() unregisters the hook."""
        return self._add_hook(self._forward_hooks, hook, prepend,
                              [(self._forward_hooks_with_kwargs, with_kwargs),
                               (self._forward_hooks_always_called, always_call)])

    def register_full_backward_hook(self, hook, prepend=False):
        """Call hook(module, grad_input, grad_output) once the gradients of the module's positional
        tensor arguments are computed (grad_input: one entry per argument, None where none flows;
        grad_output: one per output). A result that is not None replaces grad_input. Only calls made
        after registering, with gradients enabled, are seen. Returns a removable handle."""
        return self._add_hook(self._backward_hooks, hook, prepend, [])

    def register_full_backward_pre_hook(self, hook, prepend=False):
        """Call hook(module, grad_output) once the gradients of the module's outputs are computed; a
        result that is not None replaces grad_output. Returns a removable handle."""
        return self._add_hook(self._backward_pre_hooks, hook, prepend, [])

    # ---- traversal ---------------------------------------------------------------------------
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) for this module and every descendant, each once unless
        remove_duplicate=False."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        """(name, module) for each direct child, a child registered under two names once."""
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self):
        for _, child in self.named_children():
            yield child

    def named_parameters(self, prefix="", recurse=True):
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, parameter in module._parameters.items():
                if parameter is not None and id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield (f"{module_prefix}.{name}" if module_prefix else name), parameter

    def parameters(self, recurse=True):
        for _, parameter in self.named_parameters(recurse=recurse):
            yield parameter

    def named_buffers(self, prefix="", recurse=True):
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
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
        """Drop every parameter's gradient, or with set_to_none=False set it to zeros in place."""
        for parameter in self.parameters():
            if parameter.grad is None:
                continue
            if set_to_none:
                parameter.grad = None
            else:
                with no_grad():
                    parameter.grad.zero_()

    def requires_grad_(self, requires_grad=True):
        for parameter in self.parameters():
            parameter.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs):
        """Devices (`to("opencl")`, `to(mg.device("cpu"))`, or a tensor's): parameters, their gradients
        and buffers move there. Dtypes (`to(mg.bfloat16)`, `to("opencl", dtype)`, or a tensor's): float
        parameters, their gradients and float buffers are converted. Both in place: the Parameter
        objects stay, so an optimizer made before still updates them."""
        target = kwargs.get("device") or next((a for a in args if isinstance(a, (str, device))), None)
        if target is None:
            target = next((a.device for a in args if hasattr(a, "node")), None)
        if target is not None:
            for tensor in list(self.parameters()) + list(self.buffers()):
                tensor.data = tensor.detach().to(target)
                if getattr(tensor, "grad", None) is not None:
                    tensor.grad = tensor.grad.to(target)
        dtype = kwargs.get("dtype") or next((a for a in args if not isinstance(a, (str, device))), None)
        if dtype is None:
            return self
        dtype = dtype.dtype if hasattr(dtype, "node") else dtypes.as_dtype(dtype)
        if not dtype.is_float:
            raise DTypeError(f"Module.to only accepts floating point dtypes, got {dtype.name}")
        for tensor in list(self.parameters()) + list(self.buffers()):
            if tensor.dtype.is_float:
                tensor.data = tensor.to(dtype)
                if getattr(tensor, "grad", None) is not None:
                    tensor.grad = tensor.grad.to(dtype)
        return self

    def double(self):
        return self.to(dtypes.float64)

    def float(self):
        return self.to(dtypes.float32)

    def half(self):
        return self.to(dtypes.float16)

    def bfloat16(self):
        return self.to(dtypes.bfloat16)

    def cpu(self):
        """Parameters and buffers moved to the host."""
        return self.to(device("cpu"))

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self, prefix=""):
        """Parameters and persistent buffers by dotted name, in registration order (as PyTorch)."""
        state = OrderedDict()
        for module_prefix, module in self.named_modules(prefix=prefix):
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
            if target.shape == () and array.shape == (1,):
                array = array.reshape(())   # a PyTorch 0.3 checkpoint's scalar, as PyTorch's loader takes
            if tuple(array.shape) != target.shape:
                raise ShapeError(f"load_state_dict for {type(self).__name__}: {key!r} has shape "
                                 f"{tuple(array.shape)} in the checkpoint but {target.shape} in the model")
            from metagraph.creation import from_numpy_array
            target.assign(from_numpy_array(array, target.dtype))
        return missing, unexpected

    def __deepcopy__(self, memo):
        """A copy whose parameters and buffers are new tensors holding copies of the values (as
        PyTorch's; TransformerEncoder clones its layer so). Tensors are not copied field by field: a
        copied graph node would keep its id, by which autograd and the backends tell nodes apart,
        and a copied dtype would not be the dtype (dtypes compare by identity)."""
        for tensor in list(self.parameters()) + list(self.buffers()):
            if id(tensor) not in memo:
                value = as_tensor(tensor.numpy(), dtype=tensor.dtype, device=tensor.device)
                memo[id(tensor)] = Parameter(value, tensor.requires_grad) if isinstance(tensor, Parameter) \
                    else value
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            object.__setattr__(clone, name, copy.deepcopy(value, memo))
        return clone

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


