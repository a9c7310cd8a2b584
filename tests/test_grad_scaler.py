"""mg.amp.GradScaler against torch.amp.GradScaler step for step (the same gradient sequence, inf
and NaN steps included), unscale_ before clipping, state_dict both ways, the static mode and the
errors of calls out of order."""
import numpy as np
import pytest

import metagraph as mg

# Unscaled gradients of a 4-parameter model, one row per step: overflowing steps (inf, NaN, a value
# that the scale pushes past float32's range) between clean ones.
SEQUENCE = [[1.0, -2.0, 3.0, 0.5], [np.inf, 1.0, 1.0, 1.0], [0.1, 0.2, 0.3, 0.4], [np.nan, 0.0, 0.0, 0.0],
            [1e-3, 2.0, -1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 0.0, 1.0], [3e34, 1.0, 0.0, 0.0],
            [1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5], [-1.0, 0.0, 1.0, 0.0], [1e-8, -1e-8, 0.0, 1.0],
            [-np.inf, 0.0, 0.0, 0.0], [0.25, 0.25, 0.0, 0.0], [1.0, -1.0, 1.0, -1.0]]
START = np.array([1.0, 2.0, -1.0, 0.5], np.float32)


def _run(lib, scaler, clip=None, seq=SEQUENCE):
    """Train on the sequence: (scale, growth tracker, params, step skipped) after each step."""
    param = lib.tensor(START.copy(), requires_grad=True)
    optimizer = lib.optim.SGD([param], lr=0.1)
    rows = []
    for grads in seq:
        optimizer.zero_grad()
        before = np.array(param.detach().numpy())
        scaler.scale((param * lib.tensor(np.array(grads, np.float32))).sum()).backward()
        if clip is not None:
            scaler.unscale_(optimizer)
            lib.nn.utils.clip_grad_norm_([param], clip)
        scaler.step(optimizer)
        scaler.update()
        after = np.array(param.detach().numpy())
        rows.append((scaler.get_scale(), scaler.state_dict().get("_growth_tracker"), after,
                     bool(np.array_equal(before, after))))
    return rows


@pytest.mark.parametrize("kwargs", [dict(init_scale=2.0 ** 10, growth_interval=2),
                                    dict(init_scale=2.0 ** 16, growth_interval=3, backoff_factor=0.25),
                                    dict(init_scale=3.0, growth_factor=1.5, growth_interval=1)])
def test_matches_torch_step_for_step(kwargs):
    torch = pytest.importorskip("torch")
    ours = _run(mg, mg.amp.GradScaler("cpu", **kwargs))
    theirs = _run(torch, torch.amp.GradScaler("cpu", **kwargs))
    for step, (mine, their) in enumerate(zip(ours, theirs)):
        assert mine[0] == their[0] and mine[1] == their[1] and mine[3] == their[3], f"step {step}"
        np.testing.assert_array_equal(mine[2], their[2], err_msg=f"step {step}")
    skipped = [row[3] for row in ours]
    assert skipped[1] and skipped[3] and skipped[12] and not skipped[0] and not skipped[2]


def test_the_default_dynamic_rule_without_torch():
    """2^16, halved on each overflow (the step skipped), doubled after growth_interval clean steps."""
    rows = _run(mg, mg.amp.GradScaler(growth_interval=4))
    scales = [row[0] for row in rows]
    assert scales[:5] == [65536.0, 32768.0, 32768.0, 16384.0, 16384.0]
    assert scales[7] == 8192.0 and rows[7][3]          # 3e34 * 8192 overflows float32 to inf
    assert scales[11] == 16384.0 and rows[11][1] == 0  # four clean steps (8 to 11) grew it


def test_unscale_before_clipping_matches_torch():
    torch = pytest.importorskip("torch")
    seq = [[30.0, -40.0, 0.0, 0.0], [np.inf, 0.0, 0.0, 0.0], [3.0, 4.0, 0.0, 12.0]]
    ours = _run(mg, mg.amp.GradScaler(init_scale=256.0), clip=1.0, seq=seq)
    theirs = _run(torch, torch.amp.GradScaler("cpu", init_scale=256.0), clip=1.0, seq=seq)
    for mine, their in zip(ours, theirs):
        assert mine[0] == their[0]
        np.testing.assert_allclose(mine[2], their[2], rtol=1e-6)


def test_static_scale_stays_and_still_skips_overflowing_steps():
    scaler = mg.amp.GradScaler(init_scale=128.0, dynamic=False)
    rows = _run(mg, scaler)
    assert {row[0] for row in rows} == {128.0} and not scaler.is_dynamic()
    overflowing = [bool(not np.isfinite(np.float32(np.array(g) * 128)).all()) for g in SEQUENCE]
    assert [row[3] for row in rows] == overflowing


def test_state_dict_round_trips_and_crosses_to_torch():
    scaler = mg.amp.GradScaler(init_scale=1024.0, growth_interval=2)
    _run(mg, scaler, seq=SEQUENCE[:5])
    state = scaler.state_dict()
    assert set(state) == {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    fresh = mg.amp.GradScaler()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.get_scale() == state["scale"]
    torch = pytest.importorskip("torch")
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(state)
    assert theirs.state_dict() == state
    back = mg.amp.GradScaler()
    back.load_state_dict(theirs.state_dict())
    assert back.state_dict() == state


def test_disabled_scaler_passes_through():
    scaler = mg.amp.GradScaler(enabled=False)
    loss = mg.tensor(2.0, requires_grad=True) * 3
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.update()
    with pytest.raises(mg.MetagraphError, match="saved from a disabled"):
        mg.amp.GradScaler().load_state_dict({})


def test_calls_out_of_order_are_errors():
    param = mg.tensor(np.ones(2, np.float32), requires_grad=True)
    optimizer = mg.optim.SGD([param], lr=0.1)
    scaler = mg.amp.GradScaler()
    with pytest.raises(mg.MetagraphError, match=r"GradScaler.step: no scale yet"):
        scaler.step(optimizer)
    scaler.scale(param.sum()).backward()
    with pytest.raises(mg.MetagraphError, match=r"no inf checks were recorded"):
        scaler.update()
    scaler.unscale_(optimizer)
    with pytest.raises(mg.MetagraphError, match=r"unscale_\(\) has already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(mg.MetagraphError, match=r"step\(\) has already been called"):
        scaler.step(optimizer)
    with pytest.raises(mg.MetagraphError, match=r"unscale_\(\) is being called after step\(\)"):
        scaler.unscale_(optimizer)
    with pytest.raises(mg.ArgumentError, match="closure"):
        scaler.step(optimizer, closure=lambda: None)
    scaler.update()
    with pytest.raises(mg.ArgumentError, match="growth factor must be > 1.0"):
        mg.amp.GradScaler(growth_factor=1.0)
    with pytest.raises(mg.ArgumentError, match="outputs must be a Tensor"):
        scaler.scale("loss")


def test_float16_gradients_are_refused_as_pytorch_does():
    param = mg.tensor(np.ones(2), dtype=mg.float16, requires_grad=True)
    optimizer = mg.optim.SGD([param], lr=0.1)
    scaler = mg.amp.GradScaler()
    scaler.scale(param.sum()).backward()
    with pytest.raises(mg.DTypeError, match="unscale float16 gradients"):
        scaler.step(optimizer)


def test_unscaling_keeps_the_gradients_and_leaves_the_division_lazy():
    """unscale_ computes the gradients and the inf check once; the division by the scale stays a
    pending multiply that the optimizer's update absorbs, not a second set of gradient buffers."""
    rng = np.random.default_rng(0)
    x, y = mg.tensor(rng.standard_normal((32, 64)).astype(np.float32)), mg.tensor(rng.integers(0, 10, 32))
    model = mg.nn.Sequential(mg.nn.Linear(64, 128), mg.nn.ReLU(), mg.nn.Linear(128, 10))
    opt = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = mg.amp.GradScaler()
    scaler.scale(mg.nn.functional.cross_entropy(model(x), y)).backward()
    scaled = [p.grad for p in model.parameters()]
    scaler.unscale_(opt)
    assert all(g.node.buffer is not None for g in scaled)                  # computed, kept
    assert all(p.grad.node.buffer is None for p in model.parameters())     # divided lazily
    for p, g in zip(model.parameters(), scaled):
        np.testing.assert_allclose(p.grad.numpy(), g.numpy() / 65536.0, rtol=1e-6)
