"""ops/node_replay.py: the C extension builds a replay's nodes exactly as the Python version does,
and refuses malformed steps with an error, never a crash."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph.errors import DeviceError
from metagraph.ops import math as m
from metagraph.ops import node_replay
from metagraph.ops.node import Node
from metagraph.ops.node_replay import SLOT_NAMES, build, built_in_python
from metagraph.ops.recorded import recorded


def test_the_extension_is_built():
    # `pip install -e .` builds it (setup.py); without it every replay builds its nodes in Python
    assert node_replay.native is not None


def _slots(node, number):
    """A node's slots, its inputs by their numbers in `number` (id(node) -> number), its id left out."""
    found = {name: getattr(node, name) for name in SLOT_NAMES if name not in ("id", "inputs")}
    found["inputs"] = tuple(number[id(source)] for source in node.inputs)
    return found


def _both(steps, arguments, site, composite):
    """The nodes each builder appends for `steps` after `arguments`, with their slots and ids."""
    built = []
    for native in (True, False):
        slots = list(arguments)
        (build if native else built_in_python)(steps, slots, site, composite)
        number = {id(node): k for k, node in enumerate(slots)}
        built.append(([_slots(node, number) for node in slots[len(arguments):]],
                      [node.id for node in slots[len(arguments):]]))
    return built


_OPS = [lambda a, b: m.add(a, b), lambda a, b: m.mul(a, 0.5), lambda a, b: m.exp(b),
        lambda a, b: m.maximum(b, a)]


@settings(max_examples=25, deadline=None)
@given(program=st.lists(st.tuples(st.integers(0, len(_OPS) - 1), st.integers(0, 9), st.integers(0, 9)),
                        min_size=1, max_size=6),
       requires_grad=st.booleans(), device=st.sampled_from([None, "cpu"]))
def test_both_builders_give_the_same_nodes(program, requires_grad, device):
    def composite(x, y):
        values = [x, y]
        for number, first, second in program:
            values.append(_OPS[number](values[first % len(values)], values[second % len(values)]))
        return values[-1]
    x = mg.tensor(np.ones((2, 3), np.float32), requires_grad=requires_grad).node
    y = mg.tensor(np.ones((2, 3), np.float32)).node
    x.device = y.device = device
    recorded(composite)(x, y)
    template = _template_of(composite)
    site = ("here", 1)
    (native, native_ids), (python, python_ids) = _both(template.built, [x, y] + template.constants, site, "f")
    assert native == python and native
    assert native_ids == sorted(native_ids) and native_ids[0] < python_ids[0]   # fresh ids, in order
    assert all(slots["device"] == device and slots["composite"] == "f" and slots["site"] is site
               and slots["replayed_from"] is None and slots["buffer"] is None for slots in native)


def _template_of(composite):
    from metagraph.ops.recorded import _TEMPLATES
    (template,) = [t for key, t in _TEMPLATES.items() if key[0] is composite]
    return template


def test_a_recorded_backward_steps_composite_and_device_are_its_own():
    a = Node("const", (), {"value": 1.0}, (), mg.float32)
    step = ("neg", {}, (), mg.float32, False, False, 7, (0,), "loss_backward", "cpu")
    (native, _), (python, _) = _both((step, step[:7] + ((1,),) + step[8:]), [a], ("f", 2), None)
    assert native == python
    assert [s["composite"] for s in native] == ["loss_backward"] * 2 and native[1]["inputs"] == (1,)
    assert all(s["device"] == "cpu" and s["signature"] == 7 for s in native)


def test_inputs_on_two_devices_raise_the_same_error_from_both():
    a = mg.tensor(np.ones(2, np.float32)).node
    b = mg.tensor(np.ones(2, np.float32)).node
    a.device, b.device = "cpu", "opencl"
    step = ("add", {}, (2,), mg.float32, False, False, 3, (0, 1))
    messages = []
    for native in (True, False):
        slots = [a, b]
        with pytest.raises(DeviceError) as raised:
            (build if native else built_in_python)((step,), slots, ("user.py", 3), "f")
        messages.append(str(raised.value))
        assert len(slots) == 2                   # nothing appended
    assert messages[0] == messages[1] and "cpu" in messages[0] and "opencl" in messages[0]


@pytest.mark.parametrize("steps, error", [
    ((("add", {}, (2,), mg.float32, False, False, 3, (0, 5)),), IndexError),     # no slot 5
    ((("add", {}, (2,), mg.float32, False, False, 3, (0, -1)),), IndexError),
    ((("add", {}, (2,), mg.float32, False, False, 3, (0, "1")),), TypeError),
    ((("add", {}, (2,), mg.float32, False, False, 3, (2,)),), TypeError),         # slot 2 holds no node
    ((("add", {}, (2,), mg.float32),), TypeError),                                # too short
    ((("add", {}, (2,), mg.float32, False, False, 3, [0]),), TypeError),          # positions not a tuple
])
def test_the_extension_refuses_malformed_steps(steps, error):
    a = mg.tensor(np.ones(2, np.float32)).node
    with pytest.raises(error):
        build(steps, [a, a, "not a node"], ("user.py", 3), None)


def test_slot_names_are_nodes_slots():
    assert set(SLOT_NAMES) == set(Node.__slots__) - {"__weakref__"}


def _argument_values():
    a = mg.tensor(np.ones((2, 3), np.float32)).node
    b = mg.tensor(np.ones(4, np.float64), requires_grad=True).node
    return st.lists(st.sampled_from([a, b, 0, 3, -1.5, 0.0, -0.0, True, "mean", None, mg.float16, (a, 2),
                                     [b, None], {"dim": 1, "x": a}, (1.0, "s")]), max_size=6)


@settings(max_examples=60, deadline=None)
@given(values=_argument_values())
def test_both_describe_a_calls_arguments_alike(values):
    from metagraph.ops.recorded import _arguments, _arguments_in_python
    seen_native, seen_python = [], []
    assert _arguments(tuple(values), seen_native) == _arguments_in_python(tuple(values), seen_python)
    assert all(a is b for a, b in zip(seen_native, seen_python)) and len(seen_native) == len(seen_python)


def test_an_argument_that_cannot_be_described_raises_the_same_from_both():
    from metagraph.ops.recorded import _arguments, _arguments_in_python, _Unkeyable
    for describe in (_arguments, _arguments_in_python):
        with pytest.raises(_Unkeyable):
            describe((object(),), [])
