"""Autotuning remembered on disk: a schedule's second run times variants of its slow register
tiles (register budgets, slack, channel tiles, lanes, schedules near the heuristic's) and keeps
the fastest in the kernel cache; a later process uses it without timing; the variants compute the
same numbers; METAGRAPH_TUNE=0 and the time budget are honoured."""
import os

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.pipeline import tuning
from tests.helpers import needs


def _conv():
    rng = np.random.default_rng(5)
    x = mg.tensor(rng.standard_normal((2, 8, 14, 14)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
    return F.relu(F.conv2d(x, w, padding=1))


@pytest.fixture
def fresh_backend(tmp_path, monkeypatch):
    """A factory of C backends over one empty cache directory (each one a new process's)."""
    needs("c")
    from metagraph.codegen.c import CBackend
    from metagraph.pipeline.realize import Pipeline
    monkeypatch.setattr(mg.flags, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mg.flags, "TUNE", 30)
    monkeypatch.setattr(tuning, "MIN_SECONDS", 0.0)      # the test's kernels are fast
    return lambda: Pipeline(CBackend())


def _remembered(backend):
    return sorted(os.listdir(os.path.join(backend.cache.directory, "tuning")))


def _steps(backend):
    (entry,) = backend.schedules.values()
    return entry.steps


def test_the_second_run_tunes_and_a_later_process_uses_the_choice(fresh_backend, monkeypatch):
    # time every variant but the heuristic one as faster, so that the choice differs from it
    monkeypatch.setattr(tuning.Tuner, "time", staticmethod(
        lambda functions, step, graph, buffers: [1.0] + [0.5] * (len(functions) - 1)))
    want = NumpyBackend().realize([_conv().node])[0]
    first = fresh_backend()
    np.testing.assert_allclose(first.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    assert _remembered(first) == []                      # a first run never tunes
    np.testing.assert_allclose(first.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    assert len(_remembered(first)) == 1 and first.tuner.spent > 0
    tuned = [step.tuned_from for step in _steps(first) if step.tuned_from is not None]
    assert len(tuned) == 1                               # the conv's variant replaced it
    np.testing.assert_allclose(first.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)

    later = fresh_backend()                              # another process, the same cache
    for _ in range(3):
        np.testing.assert_allclose(later.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    assert later.tuner.spent == 0                        # remembered: nothing is timed again
    # (the same variant; its kernel takes the batch at run time there, as the timed one did not)
    assert [step.tuned_from for step in _steps(later) if step.tuned_from] == tuned

    # a choice timed on one thread count is not taken on another: that process times its own
    monkeypatch.setattr(mg.flags, "NUM_THREADS", first.target.threads + 1)
    other = fresh_backend()
    for _ in range(2):
        np.testing.assert_allclose(other.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    assert other.tuner.spent > 0 and len(_remembered(other)) == 2


def _weight_gradient(filters=32, size=8):
    """A conv's weight gradient: a 3-wide row; 32 filters over an 8x8 plane take a channel tile, 8
    over 16x16 lane accumulators."""
    rng = np.random.default_rng(6)
    x = mg.tensor(rng.standard_normal((2, 4, size, size)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((filters, 4, 3, 3)).astype(np.float32), requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    (grad,) = mg.grad((y * mg.tensor(rng.standard_normal(y.shape).astype(np.float32))).sum(), [w])
    return grad


@pytest.mark.parametrize("graph", [_conv, _weight_gradient, lambda: _weight_gradient(8, 16)])
def test_every_variant_computes_the_same_numbers(fresh_backend, monkeypatch, graph):
    from metagraph.codegen.c import CBackend
    monkeypatch.setattr(mg.flags, "TUNE", 0)
    want = NumpyBackend().realize([graph().node])[0]
    results, names = [], set()
    for target in fresh_backend().tuner.candidates():
        monkeypatch.setattr(CBackend, "target", property(lambda self, target=target: target))
        backend = fresh_backend()
        results.append(backend.realize([graph().node])[0])
        names |= {step.name for step in _steps(backend) if tuning.tunable(step)}
    assert len(names) > 1                                # the candidates are different kernels
    for result in results:      # lanes sum in another order: equal within rounding
        np.testing.assert_allclose(result, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("graph", [_conv, _weight_gradient, lambda: _weight_gradient(8, 16)])
def test_every_schedule_near_the_heuristic_computes_the_same_numbers(fresh_backend, monkeypatch, graph):
    """The search's step lists (compiler/search.py), each given to its kernel as tuning's remembered
    choice would be, against the oracle; and they are kernels of their own."""
    from metagraph.compiler.graph import pending_graph
    monkeypatch.setattr(mg.flags, "TUNE", 0)
    want = NumpyBackend().realize([graph().node])[0]
    backend = fresh_backend()
    backend.realize([graph().node])
    (step,) = [step for step in _steps(backend) if tuning.tunable(step)]
    near = backend.tuner.neighbours(pending_graph([graph().node]), step)
    assert near
    names = set()
    for target in near:
        monkeypatch.setattr(mg.flags, "TUNE", 30)
        chosen = fresh_backend()
        monkeypatch.setattr(chosen.tuner, "get",
                            lambda name, target=target: target if name == step.name else None)
        monkeypatch.setattr(chosen.tuner, "wanted", lambda run: False)
        np.testing.assert_allclose(chosen.realize([graph().node])[0], want, rtol=1e-4, atol=1e-4)
        names |= {other.name for other in _steps(chosen) if other.tuned_from == step.name}
    assert len(names) == len(near)


def test_a_remembered_schedule_that_does_not_apply_is_not_trusted(fresh_backend, monkeypatch):
    from metagraph.compiler.schedule import Rewrite
    from metagraph.compiler.lower import Target
    want = NumpyBackend().realize([_conv().node])[0]
    backend = fresh_backend()
    monkeypatch.setattr(backend.tuner, "get", lambda name: Target(steps=(Rewrite("jam", (99, 2)),)))
    monkeypatch.setattr(backend.tuner, "wanted", lambda run: False)
    np.testing.assert_allclose(backend.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    (step,) = [step for step in _steps(backend) if tuning.tunable(step)]
    assert step.tuned_from is None                      # the heuristic's kernel, not a broken one
    tuner = fresh_backend().tuner        # (the patches above were on another pipeline's tuner)
    tuner.cache.remember(tuner.key("r_kernel"), tuning.SEARCH + ' 32 128 0.75 1.5 None [["eval",[1]]]')
    assert tuner.get("r_kernel") is None


def test_tuning_off_or_out_of_time_times_nothing(fresh_backend, monkeypatch):
    monkeypatch.setattr(mg.flags, "TUNE", 0)
    backend = fresh_backend()
    for _ in range(3):
        backend.realize([_conv().node])
    assert _remembered(backend) == [] and backend.tuner.spent == 0
    monkeypatch.setattr(mg.flags, "TUNE", 30)
    spent = fresh_backend()
    spent.tuner.spent = 30.0                             # this process's budget is used up
    for _ in range(3):
        spent.realize([_conv().node])
    assert _remembered(spent) == []


def _conv_chain():
    rng = np.random.default_rng(7)
    h = mg.tensor(rng.standard_normal((2, 8, 12, 12)).astype(np.float32))
    for _ in range(3):
        h = F.relu(F.conv2d(h, mg.tensor(rng.standard_normal((8, 8, 3, 3)).astype(np.float32)), padding=1))
    return h.sum()


def test_a_tuning_run_holds_no_buffer_longer_than_another_run(fresh_backend, monkeypatch):
    """Variants are timed just after their kernel ran, on its live inputs: a conv's input goes back
    to the pool when the next conv has read it, on the tuning run as on any other."""
    monkeypatch.setattr(tuning.Tuner, "candidates", lambda self: [self.pipeline.target])   # (quick)
    backend = fresh_backend()
    peaks = []
    for _ in range(3):
        with mg.profile() as prof:
            backend.realize([_conv_chain().node])
        peaks.append(prof.peak_bytes)
    assert backend.tuner.spent > 0 and _remembered(backend)      # the second run tuned (the convs are alike)
    assert peaks[0] == peaks[1] == peaks[2]


def test_a_cached_schedule_keeps_no_kernel_ir(fresh_backend):
    backend = fresh_backend()
    want = NumpyBackend().realize([_conv().node])[0]
    for _ in range(3):             # compiled, then tuned (a variant replaces the conv), then reused
        np.testing.assert_allclose(backend.realize([_conv().node])[0], want, rtol=1e-5, atol=1e-5)
    steps = _steps(backend)
    assert any(step.tuned_from for step in steps)
    assert all(step.kernel is None and step.name for step in steps)
