"""Schedules remembered on disk (pipeline/stored.py): a graph structure any process has realised is
not lowered again, and a stored schedule that cannot be trusted is never used."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import backend, nn
from metagraph.compiler.graph import pending_graph
from metagraph.errors import IndexOutOfRange
from metagraph.pipeline import realize, stored

pytestmark = pytest.mark.usefixtures("_c_backend")


@pytest.fixture
def _c_backend():
    mg.set_backend("c")


def _step_tensors(width=6):
    """A small CNN's loss and parameter gradients (lazy): a graph of a few hundred nodes."""
    mg.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(2, width), nn.ReLU(),
                          nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 4))
    x = mg.tensor(np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32))
    loss = F.cross_entropy(model(x), mg.tensor([0, 1, 2, 3]))
    loss.backward()
    return [loss] + [p.grad for p in model.parameters()]


@pytest.fixture(autouse=True)
def _warm():
    """The first realisation in a process also realises shared constants (the seed of backward):
    its graph has one node fewer than every later one; tests compare the later ones."""
    _values(_step_tensors())


def _values(tensors):
    mg.sync(*tensors)
    return [t.numpy().copy() for t in tensors]


def _forget():
    """The c backend as a new process finds it: no schedules or kernels in memory."""
    instance = backend._instance("c")
    instance.schedules.clear()
    instance.functions.clear()
    return instance


@pytest.fixture
def lowerings(monkeypatch):
    """How many times `schedule` (lowering) runs."""
    calls = [0]
    original = realize.schedule

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(realize, "schedule", counted)
    return calls


def test_a_seen_graph_is_not_lowered_again(lowerings):
    want = _values(_step_tensors())
    _forget()
    lowerings[0] = 0
    with mg.profile() as prof:
        got = _values(_step_tensors())
    assert lowerings[0] == 0 and prof.compiles == 0 and prof.cache_hits > 0
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_stored_steps_are_the_steps_that_were_made():
    tensors = _step_tensors()
    instance = _forget()
    graph = pending_graph([t.node for t in tensors])
    _values(tensors)
    (made,) = instance.schedules.values()
    restored, _, sources = instance.stored.load(graph)
    assert sources == made.sources
    for a, b in zip(made.steps, restored):
        assert (a.name, a.blocked, a.positions, a.sites, a.library, a.lowering, a.tuned_from, a.in_place) == \
               (b.name, b.blocked, b.positions, b.sites, b.library, b.lowering, b.tuned_from, b.in_place)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign error class", "kernel gone"])
def test_a_damaged_entry_is_rebuilt_not_trusted(lowerings, damage):
    tensors = _step_tensors(width=4)
    graph = pending_graph([t.node for t in tensors])
    want = _values(tensors)
    instance = _forget()
    path = instance.stored._path(graph)
    text = open(path).read()
    if damage == "garbage":
        text = "not json"
    elif damage == "truncated":
        text = text[:len(text) // 2]
    elif damage == "foreign error class":
        entry = json.loads(text)
        entry["steps"][0]["sites"] = [["SystemExit", "x", 0]]
        text = json.dumps(entry)
    else:
        entry = json.loads(text)
        entry["steps"][0]["key"] = "0" * 64
        text = json.dumps(entry)
    with open(path, "w") as stream:
        stream.write(text)
    lowerings[0] = 0
    got = _values(_step_tensors(width=4))
    assert lowerings[0] == 1
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert instance.stored.load(graph) is not None      # the schedule made instead was written


def _gathered(index):
    x = mg.arange(40, dtype=mg.float32).reshape(8, 5)
    for k in range(40):                 # enough nodes to be stored
        x = x * 1.01 + k
    return x[mg.tensor(index)].sum()


def test_a_stored_schedule_keeps_its_run_time_checks(lowerings):
    _gathered([0, 7, 3]).item()
    _forget()
    lowerings[0] = 0
    with pytest.raises(IndexOutOfRange, match=r"getitem: index \(8, 0\) is out of bounds .*test_stored_sch"):
        _gathered([0, 8, 3]).item()
    assert lowerings[0] == 0


def _digest(tensors, threads=1):
    return stored.graph_digest(pending_graph([t.node for t in tensors]), f"threads {threads}")


def test_the_digest_names_structure_only():
    x = mg.ones(3, 4)
    assert _digest([x * 2 + 1]) == _digest([mg.ones(3, 4) * 2 + 1])
    assert _digest([x * 2 + 1]) != _digest([x * 3 + 1])
    assert _digest([x * 2 + 1]) != _digest([x * 2 - 1])
    assert _digest([x * 2 + 1]) != _digest([mg.ones(4, 3) * 2 + 1])
    assert _digest([x * 2 + 1]) != _digest([x * 2 + 1], threads=2)
    assert _digest([x * 0.0]) != _digest([x * -0.0])
    assert _digest([x.sum(0)]) != _digest([x.sum(1)])


_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import metagraph as mg
    from metagraph.pipeline import realize
    from runtime.test_stored_schedules import _step_tensors, _values
    calls = [0]
    original = realize.schedule
    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    realize.schedule = counted
    mg.set_backend("c")
    mg.flags.TUNE = 0
    values = _values(_step_tensors(width=8))
    print(calls[0], sum(float(abs(v).sum()) for v in values))
""")


def test_another_process_lowers_nothing():
    """Across processes with different string hashing, the digest and the schedule hold."""
    script = _SCRIPT.format(tests=os.path.dirname(os.path.dirname(__file__)))
    runs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.split())
    assert runs[0][0] != "0" and runs[1][0] == "0"
    assert runs[0][1] == runs[1][1]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_graphs_run_the_same_from_a_stored_schedule(data, monkeypatch):
    """Any graph (random ones from the conformance suite, stored whatever their size): a process
    that finds its schedule on disk computes the oracle's values without lowering."""
    from tests.backends.conftest import against_oracle
    from tests.backends.test_random_graphs import _graph
    monkeypatch.setattr(stored, "MIN_NODES", 0)
    with mg.no_grad():          # (a value that requires grad keeps its buffer: nothing to redo)
        out, _ = _graph(data)
    instance = _forget()        # (a schedule made before MIN_NODES changed was never stored)
    against_oracle(instance, [out])                 # lowered (or found), and stored
    _forget()
    lowering, calls = realize.schedule, []
    realize.schedule = lambda *args, **kwargs: calls.append(1) or lowering(*args, **kwargs)
    try:                        # (monkeypatch would keep it for the next example)
        against_oracle(instance, [out])
    finally:
        realize.schedule = lowering
    assert calls == []
