"""Replay (runtime/replay.py, runtime/buffer_plan.py): from a schedule's third run its kernels are
launched from a plan made once, in one native call. Whatever the path, a run gives the same values,
raises the same errors, donates the same inputs and holds the same memory as launching kernel by
kernel (executor.run)."""
import gc
import threading
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph import nn
from metagraph.runtime import buffer_plan, executor, replay
from tests.helpers import needs, trained


@pytest.fixture
def replays(monkeypatch):
    """The Replay of every replayed run, in order."""
    runs = []
    plain = replay.Replay.run

    def counted(self, graph, explain=None):
        runs.append(self)
        return plain(self, graph, explain)
    monkeypatch.setattr(replay.Replay, "run", counted)
    return runs


def _model():
    mg.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 3))


def _train(steps, seed=0, optimizer_class=mg.optim.SGD, **options):
    """Losses and final parameters of `steps` optimizer steps (SGD with momentum unless told),
    each on a new random batch."""
    model = _model()
    optimizer = optimizer_class(model.parameters(), **(options or dict(lr=0.1, momentum=0.9)))
    rng = np.random.default_rng(seed)
    return trained(model, optimizer, ((mg.tensor(rng.standard_normal((6, 3, 5, 5)).astype(np.float32)),
                                       mg.tensor(rng.integers(0, 3, 6))) for _ in range(steps)))


@pytest.mark.parametrize("name", ["c", "llvm", "bang"])
def test_replayed_training_gives_the_values_of_kernel_by_kernel_launches(name, replays, monkeypatch):
    needs(name)
    mg.set_backend(name)
    losses, parameters = _train(6)
    assert len(replays) >= 3                 # (the first step, which makes the momentum, differs)
    monkeypatch.setattr(replay, "ENABLED", False)
    plain_losses, plain_parameters = _train(6)
    assert losses == plain_losses
    for got, want in zip(parameters, plain_parameters):
        np.testing.assert_array_equal(got, want)


def test_replayed_adam_steps_give_the_values_of_kernel_by_kernel_launches(replays, monkeypatch):
    losses, parameters = _train(6, optimizer_class=mg.optim.Adam, lr=0.01, weight_decay=0.1)
    assert len(replays) >= 3
    monkeypatch.setattr(replay, "ENABLED", False)
    plain_losses, plain_parameters = _train(6, optimizer_class=mg.optim.Adam, lr=0.01, weight_decay=0.1)
    assert losses == plain_losses
    for got, want in zip(parameters, plain_parameters):
        np.testing.assert_array_equal(got, want)


def test_a_replayed_graph_follows_its_new_inputs(replays, rng):
    weight = rng.standard_normal((8, 5)).astype(np.float32)
    w = mg.tensor(weight)
    for _ in range(6):
        data = rng.standard_normal((4, 8)).astype(np.float32)
        got = ((mg.tensor(data) @ w).relu() * 2.0).sum(0).numpy()
        np.testing.assert_allclose(got, (np.maximum(data @ weight, 0) * 2).sum(0), rtol=1e-5, atol=1e-6)
    assert len(replays) == 4


def _schedule_of(run):
    """The pipeline.realize.Schedule a Replay belongs to."""
    for entry in mg.backend._active.schedules.values():
        if entry.replay_plan is run:
            return entry
    raise LookupError("no schedule holds this replay")


def test_a_replayed_run_launches_natively_and_allocates_what_its_plan_says(replays, rng, monkeypatch):
    x = mg.tensor(rng.standard_normal((64, 64)).astype(np.float32), requires_grad=True)

    def step():
        loss = ((x @ x).tanh() @ x).relu().sum()
        loss.backward()
        value = loss.item()
        x.grad = None
        return value
    for _ in range(3):
        step()
    entry = _schedule_of(replays[-1])
    launched = []

    def counting(function):
        def launch(arrays, error):
            launched.append(function)
            function(arrays, error)
        launch.address = function.address
        return launch
    entry.functions[:] = [counting(f) for f in entry.functions]
    entry.replay_plan = None                      # made again, from the counting launchers
    taken = []
    take = executor.POOL.take

    def counting_take(*args, **kwargs):
        taken.append(args)
        return take(*args, **kwargs)
    monkeypatch.setattr(executor.POOL, "take", counting_take)
    step()
    layout = next(iter(entry.replay_plan.layouts.values()))
    assert launched == []                    # every kernel called from the native loop
    assert len(taken) == len(layout.allocations) + (layout.arena_bytes > 0)
    monkeypatch.setattr(replay, "ENABLED", False)
    del taken[:]
    step()
    assert len(launched) == len(entry.steps)


def test_the_native_loop_zeroes_the_slack_of_the_arrays_it_takes_uninitialised(replays, rng, monkeypatch):
    # a replayed run takes small arrays from malloc as they are (np.empty), their slack unzeroed,
    # and the loop zeroes each value's slack before its kernel: here malloc's memory is all ones
    real_empty = np.empty

    def dirty(shape, dtype=float, *args, **kwargs):
        array = real_empty(shape, dtype, *args, **kwargs)
        array.view(np.uint8)[...] = 0xFF
        made.append(array.nbytes)
        return array
    x = mg.tensor(rng.standard_normal((8, 24)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((24, 24)).astype(np.float32))

    def run():
        product = x @ w
        outputs = [product, product.relu().sum(1)]
        mg.sync(*outputs)
        return outputs
    for _ in range(3):
        run()
    made = []
    monkeypatch.setattr(np, "empty", dirty)
    outputs = run()
    monkeypatch.undo()
    assert len(replays) == 2 and len(made) >= 2
    slack = executor.SLACK_BYTES
    for out in outputs:
        raw = out.numpy().base
        assert raw.nbytes == out.numpy().nbytes + slack and not raw[-slack:].any()
    assert any(not zero_tail for layout in replays[-1].layouts.values()
               for *_, zero_tail in layout.allocations)     # (taken without zeroing)
    np.testing.assert_allclose(outputs[1].numpy(), np.maximum(x.numpy() @ w.numpy(), 0).sum(1),
                               rtol=1e-5, atol=1e-5)


def test_replayed_runs_reuse_their_plans_slot_array_and_clear_its_error_word(replays, rng):
    table = mg.tensor(np.arange(10, dtype=np.float32))
    mg.sync(table)
    for _ in range(4):
        np.testing.assert_array_equal(_gather(table, np.array([1, 2])), [2, 4])
    layout = next(iter(replays[-1].layouts.values()))
    made = []
    new = layout._new

    def counted(*args):
        made.append(args)
        return new(*args)
    layout._new = counted
    with pytest.raises(mg.IndexOutOfRange):        # sets the error word of the array it ran with
        _gather(table, np.array([1, 99]))
    for _ in range(3):
        np.testing.assert_array_equal(_gather(table, np.array([3, 4])), [6, 8])
    assert len(made) == 1                    # a failed run's array is not handed out again
    assert len(layout.spare) == 1


def test_library_steps_run_from_python_between_native_stretches(replays, rng, monkeypatch):
    monkeypatch.setattr(mg.flags, "LIBRARY", 1)
    a = rng.standard_normal((16, 16)).astype(np.float32)
    for _ in range(5):
        b = rng.standard_normal((16, 16)).astype(np.float32)
        got = (((mg.tensor(a) + 1.0) @ mg.tensor(b)).tanh() @ mg.tensor(a)).numpy()
        np.testing.assert_allclose(got, np.tanh((a + 1) @ b) @ a, rtol=1e-4, atol=1e-4)
    assert len(replays) == 3
    assert replays[-1].python_steps


def _gather(table, index):
    return (table[mg.tensor(index)] * 2.0).numpy()     # the line an error names


def test_an_error_in_a_replayed_run_names_the_users_line(replays):
    table = mg.tensor(np.arange(10, dtype=np.float32)) + 1.0
    mg.sync(table)
    for _ in range(4):
        np.testing.assert_array_equal(_gather(table, np.array([1, 2])), [4, 6])
    before = len(replays)
    with pytest.raises(mg.IndexOutOfRange, match=r"99") as raised:
        _gather(table, np.array([1, 99]))
    assert len(replays) == before + 1
    assert "test_replay.py" in str(raised.value) and "_gather" not in str(raised.value).split("(")[0]
    line = _gather.__code__.co_firstlineno + 1
    assert f"test_replay.py:{line}" in str(raised.value)


def test_a_check_failing_in_a_replayed_run_after_a_donation_keeps_the_finished_values(replays):
    a = np.arange(8, dtype=np.float32)

    def run(index):
        state = mg.tensor(a) * 2.0
        mg.sync(state)
        state = state * 3.0                      # donated: its input dies with it
        later = (state + 1.0)[mg.tensor(index)]
        mg.sync(state, later)
        return state, later
    for _ in range(3):
        state, later = run([1, 2])
        np.testing.assert_array_equal(later.numpy(), [7, 13])
    before = len(replays)
    state = mg.tensor(a) * 2.0
    mg.sync(state)
    state = state * 3.0
    later = (state + 1.0)[mg.tensor([1, 99])]
    with pytest.raises(mg.IndexOutOfRange):
        mg.sync(state, later)
    assert len(replays) == before + 2          # the first sync's graph, then the failing one
    np.testing.assert_array_equal(state.numpy(), a * 6)


def _pointer(tensor):
    return tensor.node.buffer.__array_interface__["data"][0]


def test_a_replayed_step_updates_a_parameter_in_place_unless_the_user_holds_it(replays):
    p = nn.Parameter(mg.tensor(np.arange(12, dtype=np.float32).reshape(3, 4)))
    optimizer = mg.optim.SGD([p], lr=0.5, momentum=0.9)
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    velocity = np.zeros_like(want)

    def step():
        nonlocal want, velocity
        optimizer.zero_grad()
        (p * p).sum().backward()
        optimizer.step()
        velocity = 0.9 * velocity + 2 * want if velocity.any() else 2 * want
        want = want - 0.5 * velocity
    for _ in range(3):
        step()
    where = _pointer(p)
    step()
    assert replays and _pointer(p) == where          # written over in the replayed run
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-5)
    held = p.detach().numpy()
    kept = held.copy()
    step()
    np.testing.assert_array_equal(held, kept)         # the user's view still shows the old value
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-5)


def _peak_bytes_of_training(enabled, monkeypatch):
    """The peak of memory allocated (numpy's arrays included: tracemalloc sees them) while an MLP
    whose values are pool-sized trains, from an emptied pool."""
    monkeypatch.setattr(replay, "ENABLED", enabled)
    mg.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(256, 256), nn.ReLU())],
                          nn.Linear(256, 8))
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = mg.tensor(np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32))
    replay.native_loop()                    # (built once per process, parsing declarations)
    gc.collect()
    executor.empty_cache()
    tracemalloc.start()
    try:
        for _ in range(6):
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_replayed_training_step_holds_no_more_memory(replays, monkeypatch):
    _peak_bytes_of_training(False, monkeypatch)      # lowers the schedules both runs then share
    replayed = _peak_bytes_of_training(True, monkeypatch)
    assert len(replays) >= 3
    plain = _peak_bytes_of_training(False, monkeypatch)
    activation = 512 * 256 * 4
    assert replayed <= plain + activation // 4      # (the plans' own tables are small beside a value)


def test_a_profile_still_times_every_kernel(replays, rng):
    data = rng.standard_normal((32, 32)).astype(np.float32)
    for _ in range(4):
        (mg.tensor(data) @ mg.tensor(data)).relu().numpy()
    assert replays
    with mg.profile() as prof:
        got = (mg.tensor(data) @ mg.tensor(data)).relu().numpy()
    assert prof.launches >= 1 and all(kernel.seconds > 0 for kernel in prof.kernels)
    np.testing.assert_allclose(got, np.maximum(data @ data, 0), rtol=1e-5, atol=1e-5)


def test_threads_replaying_one_schedule_at_once_keep_their_values_apart(replays):
    weight = mg.tensor(np.linspace(-1, 1, 256, dtype=np.float32).reshape(16, 16))
    for _ in range(3):
        (mg.tensor(np.ones((8, 16), np.float32)) @ weight).tanh().numpy()
    failures = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            data = rng.standard_normal((8, 16)).astype(np.float32)
            got = (mg.tensor(data) @ weight).tanh().numpy()
            want = np.tanh(data @ weight.numpy())
            if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                failures.append(seed)
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(replays) >= 60


def test_against_torch_training_through_replay(replays):
    torch = pytest.importorskip("torch")
    mg.manual_seed(0)
    ours = nn.Linear(5, 3)
    theirs = torch.nn.Linear(5, 3)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(ours.weight.numpy()))
        theirs.bias.copy_(torch.tensor(ours.bias.numpy()))
    ours_opt = mg.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    for _ in range(6):
        data = rng.standard_normal((7, 5)).astype(np.float32)
        loss = ours(mg.tensor(data)).tanh().square().mean()
        ours_opt.zero_grad()
        loss.backward()
        ours_opt.step()
        expected = theirs(torch.from_numpy(data)).tanh().square().mean()
        theirs_opt.zero_grad()
        expected.backward()
        theirs_opt.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    np.testing.assert_allclose(ours.weight.numpy(), theirs.weight.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert len(replays) >= 3


def test_a_device_with_memory_of_its_own_keeps_launching_from_python(replays):
    needs("opencl")
    data = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    for k in range(4):
        x = mg.tensor(data * k).to("opencl")
        got = ((x * 2.0).relu() + 1.0).sync().numpy()
        np.testing.assert_array_equal(got, np.maximum(data * k * 2, 0) + 1)
    assert replays == []


@st.composite
def _lifetimes(draw):
    """A fake Replay's outputs_of, values and last uses: values computed one per step, each read
    last by a later step (or never read), a few of one size so that they can share."""
    count = draw(st.integers(1, 40))
    sizes = st.sampled_from([0, 4, 100, 4096, 300000])
    values = {p: ((), np.float32, draw(sizes)) for p in range(count)}
    last = {p: draw(st.integers(p, count - 1)) for p in range(count)}
    return SimpleNamespace(outputs_of=list(range(count)), values=values, last=last)


def _overlapping(replay_like, p, q):
    return replay_like.last[p] >= q and replay_like.last[q] >= p


@settings(max_examples=150, deadline=None)
@given(_lifetimes())
def test_values_alive_at_once_never_share_arena_bytes(replay_like):
    positions = list(replay_like.outputs_of)
    offsets, arena_bytes = buffer_plan.placed_in_arena(positions, replay_like)
    spans = {p: (offsets[p], offsets[p] + replay_like.values[p][2] + executor.SLACK_BYTES)
             for p in positions if replay_like.values[p][2]}
    for p, (start, end) in spans.items():
        assert start % buffer_plan.ALIGNMENT == 0 and end <= arena_bytes
        for q, (other_start, other_end) in spans.items():
            if p < q and _overlapping(replay_like, p, q):
                assert end <= other_start or other_end <= start, (p, q)


@settings(max_examples=150, deadline=None)
@given(_lifetimes(), st.data())
def test_values_sharing_a_pool_array_are_of_its_size_and_alive_in_turn(replay_like, data):
    positions = list(replay_like.outputs_of)
    dropped = {p for p in positions if data.draw(st.booleans())}
    groups = buffer_plan.shared_arrays(positions, dropped, replay_like)
    assert sorted(p for group in groups for p in group) == positions
    for group in groups:
        assert len({replay_like.values[p][2] for p in group}) == 1
        for earlier, later in zip(group, group[1:]):
            assert earlier in dropped and replay_like.last[earlier] < later
