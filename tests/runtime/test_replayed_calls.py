"""A recorded call's result realised at once (`(a @ b).numpy()`): once its graph has run plainly, the
pipeline runs it from what the template's walk keeps (pipeline/realize.py `_replayed`, replay.py
`run_plain`), and gives what a run through the graph gives, or leaves the run to it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.runtime import replay


@pytest.fixture
def runs(monkeypatch):
    """('plain' or 'graph', Replay) per replayed run, in order."""
    seen = []
    plain, full = replay.Replay.run_plain, replay.Replay.run

    def run_plain(self, layout, nodes, reads):
        seen.append("plain")
        return plain(self, layout, nodes, reads)

    def run(self, graph, explain=None):
        seen.append("graph")
        return full(self, graph, explain)
    monkeypatch.setattr(replay.Replay, "run_plain", run_plain)
    monkeypatch.setattr(replay.Replay, "run", run)
    return seen


def test_a_realised_matmul_runs_plainly_from_its_fourth_call(runs, rng):
    a, b = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)
    ma, mb = mg.tensor(a), mg.tensor(b)
    for _ in range(6):
        np.testing.assert_allclose((ma @ mb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    assert runs == ["graph", "plain", "plain", "plain"]      # (runs 1-2: kernel by kernel, tuning's)
    ma = mg.tensor(a + 1)                                      # new arguments, the same graph
    np.testing.assert_allclose((ma @ mb).numpy(), (a + 1) @ b, rtol=1e-5, atol=1e-5)
    assert runs[-1] == "plain"


def test_a_composite_of_several_kernels_with_an_arena_runs_plainly(runs, rng):
    x = rng.standard_normal((32, 48)).astype(np.float32)
    w, bias = rng.standard_normal(48).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    mx, mw, mbias = mg.tensor(x), mg.tensor(w), mg.tensor(bias)
    mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    for _ in range(5):
        np.testing.assert_allclose(F.layer_norm(mx, (48,), mw, mbias).numpy(),
                                   (x - mean) / np.sqrt(var + 1e-5) * w + bias, rtol=1e-4, atol=1e-5)
    assert runs[-1] == "plain"


@pytest.mark.parametrize("change", ["check", "debug", "profile", "unrealised argument", "replay off"])
def test_whatever_a_graph_run_would_look_at_sends_the_call_through_the_graph(runs, rng, monkeypatch, change):
    a = rng.standard_normal((8, 8)).astype(np.float32)
    ma = mg.tensor(a)
    for _ in range(4):
        (ma @ ma).numpy()
    assert runs[-1] == "plain"
    del runs[:]
    operand = ma
    if change == "check":
        monkeypatch.setattr(mg.flags, "CHECK", 1)
    elif change == "debug":
        monkeypatch.setattr(mg.flags, "DEBUG", 1)
    elif change == "unrealised argument":
        operand = ma * 1.0
    elif change == "replay off":
        monkeypatch.setattr(replay, "ENABLED", False)
    if change == "profile":
        with mg.profile() as report:
            got = (operand @ operand).numpy()
        assert report.launches >= 1
    else:
        got = (operand @ operand).numpy()
    np.testing.assert_allclose(got, a @ a, rtol=1e-5, atol=1e-5)
    # (an argument without a value is found by the plain run, which then leaves it to the graph)
    assert runs.count("plain") == (change == "unrealised argument")


def test_a_failed_check_in_a_plain_run_raises_through_the_graph(runs):
    table = mg.tensor(np.arange(10, dtype=np.float32).reshape(5, 2))
    index = mg.tensor(np.array([1, 2]))
    for _ in range(4):
        np.testing.assert_array_equal(F.embedding(index, table).numpy(), [[2, 3], [4, 5]])
    assert runs[-1] == "plain"
    bad = mg.tensor(np.array([1, 99]))
    with pytest.raises(mg.IndexOutOfRange, match="99"):
        F.embedding(bad, table).numpy()          # the line the error names
    assert runs[-2:] == ["plain", "graph"]      # the plain run found it; the graph's run names it
    np.testing.assert_array_equal(F.embedding(index, table).numpy(), [[2, 3], [4, 5]])
    assert runs[-1] == "plain"


_UNARY = [lambda x: x.exp(), lambda x: x.tanh(), lambda x: x * 2.0 + 1.0, lambda x: x.relu(),
          lambda x: x.softmax(-1), lambda x: x.sum(-1, keepdim=True) - x, lambda x: x.T @ x]


@settings(max_examples=20, deadline=None)
@given(chosen=st.integers(0, len(_UNARY) - 1), rows=st.integers(1, 9), cols=st.integers(1, 9),
       library=st.sampled_from([0, 1]))
def test_plain_runs_give_what_graph_runs_give(chosen, rows, cols, library):
    fn = _UNARY[chosen]
    x = np.random.default_rng(rows * 10 + cols).standard_normal((rows, cols)).astype(np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mg.flags, "LIBRARY", library)
        mx = mg.tensor(x)
        want = fn(mx).numpy().copy()
        for _ in range(4):
            np.testing.assert_array_equal(fn(mx).numpy(), want)
        patch.setattr(replay, "ENABLED", False)
        np.testing.assert_array_equal(fn(mx).numpy(), want)


def test_the_launch_extension_is_built():
    # `pip install -e .` builds it (setup.py); without it a plain run fills its slots from Python
    assert replay._launch is not None


_OTHER = mg.tensor(np.linspace(-1, 1, 35, dtype=np.float32).reshape(7, 5))
_TARGET = mg.tensor(np.linspace(-1, 1, 35, dtype=np.float32).reshape(5, 7))
_RECORDED = [lambda x: x.softmax(-1), lambda x: x @ _OTHER, lambda x: F.layer_norm(x, (7,)),
             lambda x: F.mse_loss(x, _TARGET)]


@pytest.mark.parametrize("chosen", range(len(_RECORDED)))
def test_the_python_launch_gives_what_the_extension_gives(runs, chosen, monkeypatch):
    fn = _RECORDED[chosen]
    x = np.random.default_rng(chosen).standard_normal((5, 7)).astype(np.float32)
    mx = mg.tensor(x)
    want = [fn(mx).numpy().copy() for _ in range(4)]
    monkeypatch.setattr(replay, "_launch", None)
    got = [fn(mx).numpy().copy() for _ in range(2)]
    assert runs[-2:] == ["plain", "plain"]
    np.testing.assert_array_equal(got[0], want[-1])
    np.testing.assert_array_equal(got[1], want[-1])
    operand = mg.tensor(x) * 1.0                  # an argument without a value: left to the graph
    np.testing.assert_allclose(fn(operand).numpy(), want[-1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("args, error", [
    ((1, 1, 1, 4, 1, (0,), [], (), ()), ValueError),                 # a number without an array
    ((1, 1, 1, 4, 1, (-1,), [], (), (np.zeros(2),)), ValueError),     # a negative slot
    ((1, 1, 1, 4, 1, (4,), [], (), (np.zeros(2),)), ValueError),      # a slot past the array
    ((0, 1, 1, 4, 1, (), [], (), ()), ValueError),                   # a null address
    ((1, 1, 1, 4, 1, (0,), [], (3,), ()), IndexError),                # a read past the nodes
    ((1, 1, 1, 4, 1, (0,), [], (), ("text",)), TypeError),            # an output that is no buffer
    ((1, 1, 1, 4, 1, (0,), [], (), (np.zeros((4, 4))[:, 1],)), ValueError),   # not contiguous
])
def test_the_launch_extension_refuses_malformed_arguments(args, error):
    with pytest.raises((error, BufferError)):
        replay._launch.run(*args)


def test_a_plain_run_takes_its_last_output_again_only_once_nothing_holds_it(runs, rng):
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    ma, mb = mg.tensor(a), mg.tensor(b)
    for _ in range(4):
        (ma @ mb).numpy()
    first = (ma @ mb).numpy()
    address = first.__array_interface__["data"][0]
    held = [first, (mg.tensor(a * 2) @ mb).numpy(), (mg.tensor(a * 3) @ mb)]
    held[2].numpy()
    # values the user holds keep their memory and their values
    assert len({h.__array_interface__["data"][0] for h in held[:2]} | {address}) == 2
    np.testing.assert_allclose(held[0], a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(held[1], 2 * a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(held[2].numpy(), 3 * a @ b, rtol=1e-5, atol=1e-5)
    assert runs[-3:] == ["plain"] * 3
    del held, first
    again = [(ma @ mb).numpy().__array_interface__["data"][0] for _ in range(3)]
    assert again[1] == again[2]                 # dropped at once: the same array each time


_STEPS = [      # (arity, fn) over (n, n) float32 tensors
    (2, lambda a, b: a + b), (2, lambda a, b: mg.maximum(a, b)), (2, lambda a, b: a @ b),
    (1, lambda a: (a * 0.5).exp()), (1, lambda a: a.softmax(-1)), (1, lambda a: a - a.sum(-1, keepdim=True)),
    (1, lambda a: a.tanh()),
]


@settings(max_examples=30, deadline=None)
@given(program=st.lists(st.tuples(st.integers(0, len(_STEPS) - 1), st.integers(0, 9), st.integers(0, 9)),
                        min_size=1, max_size=5),
       arity=st.integers(1, 3), n=st.integers(1, 12))
def test_random_recorded_composites_give_the_graphs_values_and_run_plainly_once_remembered(program, arity, n):
    from metagraph.ops.recorded import recorded
    from metagraph.tensor import Tensor

    def composite(*nodes):
        values = [Tensor(node) for node in nodes]
        for number, first, second in program:
            count, fn = _STEPS[number]
            values.append(fn(*[values[first % len(values)], values[second % len(values)]][:count]))
        return values[-1].node
    traced = recorded(composite)
    rng = np.random.default_rng(n * 10 + arity)
    args = [mg.tensor(rng.standard_normal((n, n)).astype(np.float32)).node for _ in range(arity)]
    seen = []
    plain = replay.Replay.run_plain

    def counted(self, layout, nodes, reads):
        seen.append(layout)
        return plain(self, layout, nodes, reads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay.Replay, "run_plain", counted)
        got, ran_plainly = [], []
        for _ in range(5):
            before = len(seen)
            got.append(Tensor(traced(*args)).numpy().copy())
            ran_plainly.append(len(seen) > before)
        result = traced(*args)
        patch.setattr(replay, "ENABLED", False)
        want = Tensor(traced(*args)).numpy()         # launched kernel by kernel
    for value in got:
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)
    if result.replayed_from is None:
        return                                       # (the composite returned an argument)
    walk = result.replayed_from[0].walk
    remembered = [layout for (_, _, layout, _) in walk.runs.values() if layout is not None]
    # remembered by the third call at the latest (another example's graph may have run the schedule
    # before; the first call, recording, may return an inner recorded call's result), the calls
    # after it run plainly
    assert ran_plainly[3:] == ([True, True] if remembered else [False, False])
