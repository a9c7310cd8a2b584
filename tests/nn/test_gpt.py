"""The zoo's small GPT: causal, trainable, equal to the same model written in PyTorch, and the
example that trains it runs."""
import os
import subprocess
import sys

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_gpt.py")


def _tokens(shape, seed=0):
    return mg.tensor(np.random.default_rng(seed).integers(0, 32, shape))


def test_a_later_token_does_not_change_earlier_logits():
    model = mg.models.gpt(vocab=32, context=8, d_model=16, heads=2, layers=2)
    a = np.random.default_rng(0).integers(0, 32, (1, 8))
    b = a.copy()
    b[0, 5:] = (b[0, 5:] + 7) % 32
    with mg.no_grad():
        la, lb = model(mg.tensor(a)).numpy(), model(mg.tensor(b)).numpy()
    np.testing.assert_allclose(la[0, :5], lb[0, :5], rtol=1e-5, atol=1e-6)
    assert not np.allclose(la[0, 5:], lb[0, 5:])


def test_training_steps_lower_the_loss_on_a_repeated_batch():
    model = mg.models.gpt(vocab=32, context=8, d_model=16, heads=2, layers=1)
    optimizer = mg.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _tokens((4, 8)), _tokens((4, 8), seed=1)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x).reshape(-1, 32), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_too_many_tokens_name_the_context():
    model = mg.models.gpt(vocab=32, context=4, d_model=8, heads=2, layers=1)
    with pytest.raises(mg.ShapeError, match="context of 4"):
        model(_tokens((1, 5)))


def test_the_gpt_equals_the_same_model_in_pytorch():
    torch = pytest.importorskip("torch")
    from metagraph.bench_transformer import _copy_weights, _torch_modules
    ours = mg.models.gpt(vocab=256, context=16, d_model=32, heads=4, layers=2)
    theirs = _torch_modules(torch)[1](256, 16, 32, 4, 2)
    _copy_weights(torch, ours, theirs)
    tokens = np.random.default_rng(0).integers(0, 256, (3, 16))
    with mg.no_grad():
        got = ours(mg.tensor(tokens)).numpy()
    want = theirs(torch.from_numpy(tokens)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_example_trains_saves_and_samples(tmp_path):
    checkpoint = tmp_path / "gpt.ckpt"
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--layers", "1", "--d-model", "16", "--heads", "2", "--context", "16",
         "--batch-size", "4", "--epochs", "1", "--steps-per-epoch", "3", "--eval-batches", "1",
         "--sample-length", "8", "--checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "validation loss" in result.stdout and "--- sample ---" in result.stdout
    state = mg.load(str(checkpoint))
    assert "blocks.0.qkv.weight" in state and state["head.weight"].shape == (256, 16)
