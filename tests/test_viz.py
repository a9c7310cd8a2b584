"""mg.viz: the pending graph as DOT with one cluster per kernel (nothing computed), rendered by
Graphviz when it is installed; timelines of traces and training curves with matplotlib."""
import inspect
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.viz.__main__ import main as viz_main

PNG = b"\x89PNG\r\n\x1a\n"


def _conv_bias_relu():
    rng = np.random.default_rng(5)
    x = mg.tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    b = mg.tensor(rng.standard_normal((1, 5, 1, 1)).astype(np.float32))
    return F.relu(F.conv2d(x, w) + b), inspect.currentframe().f_lineno


def _clusters(text):
    return re.findall(r'subgraph cluster_\d+ \{\n    label="([^"]*)"', text)


def test_the_dot_of_conv_bias_relu_has_the_clusters_its_launches_are_and_computes_nothing():
    y, line = _conv_bias_relu()
    with mg.profile() as drawing:
        text = mg.viz.dot(y)
    assert drawing.launches == drawing.compiles == 0 and y.node.buffer is None
    with mg.profile() as prof:
        y.numpy()
    labels = _clusters(text)
    assert len(labels) == prof.launches
    assert [label.split("\\n")[0] for label in labels] == [k.name for k in prof.kernels]
    assert f"conv2d+add+relu @ test_viz.py:{line}" in labels[0]
    assert "contraction" in labels[0]
    assert text.count("-> memory") == prof.launches
    assert text.count("shape=cylinder") == 3          # x, w and b, read from memory


def test_a_softmax_after_a_matmul_shows_each_kernel_and_the_values_it_reads():
    a = mg.tensor(np.ones((4, 8), np.float32))
    w = mg.tensor(np.ones((8, 6), np.float32))
    y = (a @ w).softmax(1)
    text = mg.viz.dot([y])
    with mg.profile() as prof:
        y.numpy()
    labels = _clusters(text)
    assert len(labels) == prof.launches > 1
    assert text.count("[penwidth=2]") >= prof.launches       # every kernel reads memory
    assert any("matmul" in label for label in labels) and any("softmax" in label for label in labels)


def test_realised_tensors_draw_an_empty_graph():
    x = mg.tensor(np.ones(3, np.float32))
    assert _clusters(mg.viz.dot(x)) == []


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_graphviz_renders_the_picture(tmp_path, suffix):
    y, _ = _conv_bias_relu()
    path = mg.viz.graph(y, str(tmp_path / f"graph{suffix}"))
    with open(path, "rb") as stream:
        head = stream.read(200)
    assert head.startswith(PNG) if suffix == ".png" else b"<svg" in head or b"<?xml" in head
    assert y.node.buffer is None


def test_without_graphviz_the_dot_text_is_written_and_the_user_told(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    y, _ = _conv_bias_relu()
    with pytest.warns(UserWarning, match="Graphviz's `dot` is not installed"):
        path = mg.viz.graph(y, str(tmp_path / "graph.png"))
    assert path == str(tmp_path / "graph.dot") and not os.path.exists(tmp_path / "graph.png")
    with open(path) as stream:
        assert stream.read() == mg.viz.dot(y)


def test_bad_arguments_are_named():
    y, _ = _conv_bias_relu()
    with pytest.raises(mg.ArgumentError, match="cannot tell a format"):
        mg.viz.graph(y, "graph.jpeg")
    with pytest.raises(mg.ArgumentError, match="expects tensors, got ndarray"):
        mg.viz.dot([np.ones(3)])


def test_a_trace_timeline_and_curves_are_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    y, _ = _conv_bias_relu()
    with mg.profile() as prof:
        y.numpy()
    trace = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    out = str(tmp_path / "timeline.png")
    assert viz_main([trace, out]) == 0
    with open(out, "rb") as stream:
        assert stream.read(8) == PNG
    curves = mg.viz.curves(str(tmp_path / "curves.png"),
                           {"loss": {"train": [(1, 2.0), (2, 1.0)], "test": [(1, 2.5), (2, 1.5)]},
                            "accuracy": {"test": [(1, 0.5), (2, 0.75)]}})
    with open(curves, "rb") as stream:
        assert stream.read(8) == PNG
    with pytest.raises(mg.ArgumentError, match="panels must map"):
        mg.viz.curves(str(tmp_path / "bad.png"), {"loss": [(1, 2.0)]})
    with pytest.raises(mg.ArgumentError, match="no complete"):
        mg.viz.timeline({"traceEvents": []}, out)


def test_plotting_without_matplotlib_says_how_to_install_it(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(mg.MetagraphError, match=r"pip install 'metagraph\[examples\]'"):
        mg.viz.curves("never.png", {"loss": {"train": [(1, 1.0)]}})


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


@pytest.mark.parametrize("example, args", [
    ("train_digits.py", ["--mlp", "--epochs", "2"]),
    ("train_gpt.py", ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "16",
                      "--batch-size", "4", "--epochs", "1", "--steps-per-epoch", "3", "--eval-batches", "1",
                      "--sample-length", "4"]),
])
def test_the_examples_draw_their_curves(tmp_path, example, args):
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn" if example == "train_digits.py" else "tqdm")
    plot = tmp_path / "curves.png"
    extra = ["--checkpoint", str(tmp_path / "gpt.ckpt")] if example == "train_gpt.py" else []
    command = [sys.executable, os.path.join(EXAMPLES, example), *args, *extra, "--plot", str(plot)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"curves drawn to {plot}" in result.stdout
    with open(plot, "rb") as stream:
        assert stream.read(8) == PNG
