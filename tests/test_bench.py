"""The benchmark suite's behaviour, not its timings: both sides of a row compute the same thing, the
zoo's PyTorch twins equal the zoo, and the command line picks rows and threads as documented."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import metagraph as mg
from metagraph import bench
from metagraph.bench_kernels import conv, layer_norm, matmul
from metagraph.bench_zoo import ZOO, geometric_mean, twin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_zoo_twins_compute_what_the_zoo_computes(name):
    torch = pytest.importorskip("torch")
    size = 64 if name == "alexnet" else 32
    model = ZOO[name][0](num_classes=5).eval()
    reference = twin(torch, name, model, num_classes=5)
    x = np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)
    with mg.no_grad():
        got = model(mg.tensor(x)).numpy()
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("make", [matmul(5, 3, 7, roof=True), conv(2, 4, 3, 6, 3), conv(2, 6, 4, 5, 1),
                                  conv(2, 4, 4, 6, 3, groups=4), conv(2, 4, 3, 6, 3, backward=True),
                                  conv(2, 4, 3, 12, 3, backward=True, stride=2), layer_norm(4, 8)])
def test_both_sides_of_a_kernel_row_compute_the_same(make):
    torch = pytest.importorskip("torch")
    ours, theirs, _, _, *more = make(torch)
    others = [theirs] + (list(more[0].values()) if more else [])
    got = ours()
    for other in others:
        for mine, want in zip(_arrays(got), _arrays(other()), strict=True):
            np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-4)


def _arrays(value):
    """A call's results as a list: a backward row returns the output and the input's and the weight's
    gradients."""
    return list(value) if isinstance(value, tuple) else [value]


def test_only_takes_ids_and_groups():
    ids = ["W1", "W10f", "W10b", "K1a", "K1b", "K2f", "Z2a", "Z2b"]
    assert bench.chosen_ids("W1,K1", ids) == {"W1", "K1a", "K1b"}
    assert bench.chosen_ids("W10", ids) == {"W10f", "W10b"}
    with pytest.raises(ValueError, match="K9"):
        bench.chosen_ids("K9", ids)


def test_a_row_with_references_has_a_roof(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bench, "MIN_SECONDS", 0.0)
    row = bench.measure("K", "matmul", matmul(16, 16, 16, roof=True), torch, repeat=1)
    assert set(row["references"]) == {"numpy"}
    assert row["roof"] == max(row["pytorch"], row["references"]["numpy"])
    assert row["of_roof"] == pytest.approx(row["metagraph"] / row["roof"])


def test_the_geometric_mean_row_covers_the_batch_one_rows():
    rows = [{"id": "Z2a", "metagraph": 2.0, "pytorch": 4.0, "ratio": 2.0},
            {"id": "Z2b", "metagraph": 8.0, "pytorch": 4.0, "ratio": 0.5},
            {"id": "Z1", "metagraph": 100.0, "pytorch": 1.0, "ratio": 0.01}]
    row = geometric_mean(rows)
    assert row["id"] == "Z2" and row["metagraph"] == pytest.approx(4.0)
    assert row["pytorch"] == pytest.approx(4.0) and row["ratio"] == pytest.approx(1.0)
    assert geometric_mean(rows[:1]) is None


def test_threads_sets_the_count_the_run_reports(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "metagraph.bench", "--only", "K1a", "--threads", "1",
                             "--repeat", "1", "--no-cold", "--json", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ", 1 threads," in result.stdout.splitlines()[0]
    assert [row["id"] for row in json.loads(out.read_text())] == ["K1a"]
