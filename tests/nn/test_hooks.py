"""Module hooks and registration against PyTorch's behaviour: call order, removal, replacement."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn

torch = pytest.importorskip("torch")

FRAMEWORKS = [(nn, mg.tensor), (torch.nn, torch.tensor)]


def _net(framework):
    return framework.Sequential(framework.Linear(3, 4), framework.ReLU(), framework.Linear(4, 2))


def _hook_log(framework, make_input, prepend):
    """Register logging hooks on a net and its children; the log of one call."""
    net, log = _net(framework), []

    def tagged(tag):
        def hook(module, *rest):
            log.append((tag, type(module).__name__, len(rest)))
        return hook

    for module in [net, *net.children()]:
        module.register_forward_pre_hook(tagged("pre-1"))
        module.register_forward_pre_hook(tagged("pre-2"), prepend=prepend)
        module.register_forward_hook(tagged("hook-1"))
        module.register_forward_hook(tagged("hook-2"), prepend=prepend)
        module.register_forward_hook(tagged("hook-kwargs"), with_kwargs=True)
    net(make_input(np.ones((2, 3), dtype=np.float32)))
    return log


@pytest.mark.parametrize("prepend", [False, True])
def test_hook_call_order_matches_torch(prepend):
    ours, theirs = (_hook_log(framework, make, prepend) for framework, make in FRAMEWORKS)
    assert ours == theirs
    assert ours[0][0] == ("pre-2" if prepend else "pre-1")


def test_forward_hook_replaces_the_output_and_sees_args():
    for framework, make in FRAMEWORKS:
        layer, seen = framework.ReLU(), []
        layer.register_forward_hook(lambda module, args, output: seen.append(len(args)))    # None: kept
        layer.register_forward_hook(lambda module, args, output: output * 10)
        layer.register_forward_hook(lambda module, args, output: output + 1)                 # sees the x10
        out = layer(make(np.array([-1.0, 2.0], dtype=np.float32)))
        np.testing.assert_allclose(np.asarray(out.tolist()), [1.0, 21.0])
        assert seen == [1]


def test_forward_pre_hook_replaces_the_arguments():
    for framework, make in FRAMEWORKS:
        layer = framework.ReLU()
        handle = layer.register_forward_pre_hook(lambda module, args: -args[0])     # a single value
        assert layer(make(np.array([-1.0, 2.0]))).tolist() == [1.0, 0.0]
        handle.remove()
        layer.register_forward_pre_hook(lambda module, args: (args[0] * 2,))         # a tuple
        assert layer(make(np.array([-1.0, 2.0]))).tolist() == [0.0, 4.0]


class _Scale:
    """A module with a keyword argument, in both frameworks."""

    @staticmethod
    def make(framework):
        class Scale(framework.Module):
            def forward(self, x, factor=1.0):
                return x * factor
        return Scale()


def test_hooks_with_kwargs():
    for framework, make in FRAMEWORKS:
        module, seen = _Scale.make(framework), []

        def pre(module, args, kwargs):
            return (args[0] + 1,), {"factor": kwargs["factor"] * 3}

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(lambda m, args, kwargs, out: seen.append(dict(kwargs)), with_kwargs=True)
        assert module(make(np.array([1.0])), factor=2.0).tolist() == [12.0]
        assert seen == [{"factor": 6.0}]


def test_bad_pre_hook_with_kwargs_result():
    for framework, make in FRAMEWORKS:
        module = _Scale.make(framework)
        module.register_forward_pre_hook(lambda m, args, kwargs: args, with_kwargs=True)
        with pytest.raises(RuntimeError, match="forward pre-hook .*must return None or a tuple"):
            module(make(np.array([1.0])))


def test_remove_handles():
    for framework, make in FRAMEWORKS:
        layer, log = framework.ReLU(), []
        first = layer.register_forward_hook(lambda *a: log.append("first"))
        second = layer.register_forward_hook(lambda *a: log.append("second"), always_call=True)
        layer(make(np.array([1.0])))
        first.remove()
        first.remove()                                  # removing twice is harmless
        layer(make(np.array([1.0])))
        with second:
            pass                                        # leaving the block removes it
        layer(make(np.array([1.0])))
        assert log == ["first", "second", "second"]
        assert first.id != second.id and not layer._forward_hooks_always_called


def test_clearing_the_tables_drops_every_hook():
    for framework, make in FRAMEWORKS:
        layer, log = framework.ReLU(), []
        layer.register_forward_hook(lambda *a: log.append("hook"))
        layer._forward_hooks.clear()
        layer(make(np.array([1.0])))
        assert log == []


def test_a_hook_that_removes_another_during_the_call():
    """Each table is read once per call, as PyTorch's: a hook removed mid-call still runs that once."""
    logs = []
    for framework, make in FRAMEWORKS:
        layer, log, handles = framework.ReLU(), [], []
        handles.append(layer.register_forward_hook(lambda *a: (log.append("a"), handles[1].remove())[1]))
        handles.append(layer.register_forward_hook(lambda *a: log.append("b")))
        layer(make(np.array([1.0])))
        layer(make(np.array([1.0])))
        logs.append(log)
    assert logs[0] == logs[1] == ["a", "b", "a"]


class _Failing:
    @staticmethod
    def make(framework):
        class Failing(framework.Module):
            def forward(self, x):
                raise ValueError("forward failed")
        return Failing()


def test_always_call_hooks_run_when_forward_raises():
    logs = []
    for framework, make in FRAMEWORKS:
        module, log = _Failing.make(framework), []
        module.register_forward_hook(lambda m, args, out: log.append(("plain", out)))
        module.register_forward_hook(lambda m, args, out: log.append(("always", out)), always_call=True)
        module.register_forward_hook(lambda m, args, kwargs, out: log.append(("kwargs", kwargs)),
                                     always_call=True, with_kwargs=True)
        with pytest.raises(ValueError, match="forward failed"):
            module(make(np.array([1.0])))
        logs.append(log)
    assert logs[0] == logs[1] == [("always", None), ("kwargs", {})]


def test_an_always_call_hook_error_becomes_a_warning():
    for framework, make in FRAMEWORKS:
        module = _Failing.make(framework)

        def broken(*args):
            raise KeyError("hook failed")

        module.register_forward_hook(broken, always_call=True)
        with pytest.warns(UserWarning, match="always_call=True.* raised an exception.*hook failed"):
            with pytest.raises(ValueError, match="forward failed"):
                module(make(np.array([1.0])))


def test_register_buffer_matches_torch():
    for framework, make in FRAMEWORKS:
        module = framework.Module()
        module.register_buffer("kept", make([1.0]))
        module.register_buffer("scratch", make([2.0]), persistent=False)
        module.register_buffer("empty", None)
        assert list(module.state_dict()) == ["kept"]
        assert [name for name, _ in module.named_buffers()] == ["kept", "scratch"]
        assert module.empty is None
        module.register_buffer("scratch", make([3.0]))              # now persistent
        assert list(module.state_dict()) == ["kept", "scratch"]
        module.weight = framework.Parameter(make([1.0]))
        for name, value, error in [("a.b", make([1.0]), KeyError), ("", make([1.0]), KeyError),
                                   ("weight", make([1.0]), KeyError), (3, make([1.0]), TypeError),
                                   ("c", [1.0], TypeError)]:
            with pytest.raises(error):
                module.register_buffer(name, value)


def test_register_buffer_errors_name_the_function():
    with pytest.raises(KeyError, match="register_buffer: attribute 'training' already exists"):
        nn.Module().register_buffer("training", mg.tensor([1.0]))
    with pytest.raises(TypeError, match="register_buffer: cannot assign a list to buffer 'b'"):
        nn.Module().register_buffer("b", [1.0])


def test_named_modules_apply_and_zero_grad_match_torch():
    results = []
    for framework, make in FRAMEWORKS:
        shared = framework.Linear(2, 2)
        net = framework.Sequential(shared, framework.ReLU(), shared)
        visited = []
        net.apply(lambda m: visited.append(type(m).__name__))
        names = [name for name, _ in net.named_modules()]
        every = [name for name, _ in net.named_modules(None, "net", False)]     # PyTorch's positional order
        net(make(np.ones((1, 2), dtype=np.float32))).sum().backward()
        net.zero_grad(set_to_none=False)
        zeros = [p.grad.tolist() for p in net.parameters()]
        net.zero_grad()
        results.append((visited, names, every, zeros, [p.grad for p in net.parameters()]))
    assert results[0] == results[1]
    assert results[0][2] == ["net", "net.0", "net.1", "net.2"] and results[0][4] == [None, None]
