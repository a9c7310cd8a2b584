"""Kernels map back to the user's ops and lines: in the profile's table, its key_averages, the
Chrome trace it exports, METAGRAPH_DEBUG=1 and the comment heading a compiled source file, which
stays outside the kernel's cache key (a kernel built from two lines compiles once)."""
import glob
import inspect
import json
import os

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import provenance
from tests.helpers import needs

HERE = os.path.abspath(__file__)


def _here(line):
    return f"{HERE}:{line}"


def _valid_trace(trace):
    """Check the Trace Event Format: complete events with times, metadata naming every thread."""
    assert set(trace) == {"traceEvents", "displayTimeUnit"}
    events = trace["traceEvents"]
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for event in events:
        assert event["ph"] in ("X", "M") and isinstance(event["name"], str)
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert event["ts"] >= 0 and event["dur"] >= 0 and event["tid"] in named
            json.dumps(event["args"])
    return [e for e in events if e["ph"] == "X"]


def test_a_resnet18_training_step_traces_one_event_per_launch_naming_ops_and_lines(tmp_path):
    model = mg.models.resnet18(num_classes=10)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = mg.randn(2, 3, 32, 32), mg.tensor(np.array([3, 7]))
    with mg.profile() as prof:
        loss = F.cross_entropy(model(x), y); forward_line = inspect.currentframe().f_lineno  # noqa: E702
        optimizer.zero_grad()
        loss.backward(); backward_line = inspect.currentframe().f_lineno  # noqa: E702
        optimizer.step(); step_line = inspect.currentframe().f_lineno  # noqa: E702
        loss.item()
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as stream:
        events = _valid_trace(json.load(stream))
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert len(kernels) == prof.launches > 100
    lines = set()
    for event in kernels:
        assert event["args"]["ops"] and event["name"] == event["args"]["ops"]
        assert event["args"]["kernel"] in {k.name for k in prof.kernels}
        assert event["args"]["lines"]
        lines.update(event["args"]["lines"])
    assert lines == {_here(forward_line), _here(backward_line), _here(step_line)}
    ops = {op for e in kernels for op in e["args"]["ops"].split("+")}
    assert {"conv2d", "batch_norm", "relu", "conv2d_backward", "cross_entropy"} <= ops
    assert sum(len(e["args"]["kernels"]) for e in events if e["cat"] == "compile") == prof.compiles
    realisations = [e for e in events if e["cat"] == "realise"]
    assert realisations and all(e["args"]["at"].startswith(HERE) for e in realisations)
    for event in kernels:       # every launch lies inside a realisation on its thread
        assert any(r["tid"] == event["tid"] and r["ts"] <= event["ts"] and
                   event["ts"] + event["dur"] <= r["ts"] + r["dur"] + 1 for r in realisations)


def test_a_kernel_names_the_line_of_this_file_that_built_it():
    x = mg.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
    y = mg.relu(x * 1.75 + 0.25); line = inspect.currentframe().f_lineno  # noqa: E702
    with mg.profile() as prof:
        y.numpy()
    (stats,) = prof.kernels
    assert stats.lines == ((HERE, line),)
    assert stats.ops == ("mul", "add", "relu")
    assert f"mul+add+relu @ test_trace.py:{line}" in prof.table()


@pytest.mark.parametrize("name", ["c", "llvm", "bang"])
def test_a_kernel_from_two_lines_compiles_once_and_each_run_names_its_own_line(name):
    needs(name)
    mg.set_backend(name)
    start = np.arange(30, dtype=np.float32).reshape(5, 6) + 0.125 * ["c", "llvm", "bang"].index(name)
    a = mg.tensor(start).exp() * 0.625 - 3.0; first = inspect.currentframe().f_lineno  # noqa: E702
    with mg.profile() as one:
        a.numpy()
    b = mg.tensor(start).exp() * 0.625 - 3.0; second = inspect.currentframe().f_lineno  # noqa: E702
    with mg.profile() as two:
        b.numpy()
    assert two.compiles == 0 and two.launches == one.launches == 1
    assert one.kernels[0].name == two.kernels[0].name
    assert one.kernels[0].lines == ((HERE, first),) and two.kernels[0].lines == ((HERE, second),)
    hashed = one.kernels[0].source
    assert "what these kernels were first compiled for" not in hashed
    if one.compiles:      # the suite shares its cache: another run may have compiled it first
        (compile_event,) = [e for e in one.events if e.category == "compile"]
        written = [p for p in glob.glob(os.path.splitext(compile_event.args["path"])[0] + ".*")
                   if not p.endswith((".so", ".o"))]
        with open(written[0]) as stream:
            text = stream.read()
        comment = ";" if name == "llvm" else "//"
        assert text.startswith(f"{comment} metagraph: what these kernels were first compiled for")
        assert f"{one.kernels[0].name}: exp+mul+sub @ {HERE}:{first}" in text
        assert hashed in text


def test_debug_1_prints_each_launch_with_its_ops_and_lines(capsys, monkeypatch):
    monkeypatch.setattr(mg.flags, "DEBUG", 1)
    x = mg.tensor(np.ones((3, 5), np.float32))
    y = (x * 2.5).sum(1); line = inspect.currentframe().f_lineno  # noqa: E702
    y.numpy()
    printed = capsys.readouterr().err
    assert f"mul+sum @ test_trace.py:{line}" in printed


def test_backward_kernels_name_the_forward_composites_and_the_backward_line():
    w = mg.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    loss = F.gelu(w * 1.5).sum()
    loss.backward(); line = inspect.currentframe().f_lineno  # noqa: E702
    with mg.profile() as prof:
        w.grad.numpy()
    backward = [k for k in prof.kernels if any(op.endswith("_backward") for op in k.ops)]
    assert backward and all((HERE, line) in k.lines for k in backward)
    assert "gelu_backward" in {op for k in backward for op in k.ops}


def test_key_averages_group_launches_by_ops_or_by_line():
    x = mg.tensor(np.ones((4, 4), np.float32))
    with mg.profile() as prof:
        for scale in (1.0, 2.0):
            mg.relu(x * scale + 1.0).numpy()
        mg.sigmoid(x).numpy(); line = inspect.currentframe().f_lineno  # noqa: E702
    by_ops = prof.key_averages()
    assert sum(group.calls for group in by_ops) == prof.launches == 3
    assert {group.key: group.calls for group in by_ops} == {"mul+add+relu": 2, "sigmoid": 1}
    assert "mul+add+relu" in by_ops.table()
    by_line = prof.key_averages(group_by="line")
    assert {group.key: group.calls for group in by_line}[f"test_trace.py:{line}"] == 1
    with pytest.raises(mg.ArgumentError, match="group_by must be 'ops' or 'line'"):
        prof.key_averages(group_by="shape")


def test_origins_group_lines_by_file_and_leave_out_broadcast_views():
    origin = provenance.Origin(("conv2d", "relu"), (("/a/model.py", 41), ("/a/model.py", 42), ("/b/t.py", 7)))
    assert str(origin) == "conv2d+relu @ model.py:41,42 t.py:7"
    assert origin.lines_text(full=True) == "/a/model.py:41,42 /b/t.py:7"
    x, b = mg.tensor(np.ones((2, 3), np.float32)), mg.tensor(np.ones((1, 3), np.float32))
    with mg.profile() as prof:
        (x + b).numpy()
    assert prof.kernels[0].ops == ("add",)       # the broadcast of b is part of the add


def test_collectives_transfers_and_other_threads_events_are_in_the_trace():
    import threading
    with mg.profile() as prof:
        prof.collective("all_reduce", 4096, prof.started, 0.002)
        worker = threading.Thread(name="copier", target=lambda: prof.transfer(
            "to_device", 1024, prof.started + 0.001, 0.001))
        worker.start()
        worker.join()
    trace = prof.chrome_trace()
    collective, transfer = _valid_trace(trace)
    assert (collective["cat"], collective["name"], collective["args"]) == ("collective", "all_reduce",
                                                                           {"bytes": 4096})
    assert collective["ts"] == 0 and collective["dur"] == 2000
    assert (transfer["cat"], transfer["args"], transfer["ts"]) == ("transfer", {"bytes": 1024}, 1000)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[transfer["tid"]] == "copier" and transfer["tid"] != collective["tid"]


def _small_step(width):
    """A small CNN's loss and gradients (lazy): a graph large enough to be stored on disk."""
    mg.manual_seed(0)
    model = mg.nn.Sequential(mg.nn.Conv2d(3, width, 3, padding=1), mg.nn.ReLU(), mg.nn.AdaptiveAvgPool2d(1),
                             mg.nn.Flatten(), mg.nn.Linear(width, 3))
    x = mg.tensor(np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32))
    loss = F.cross_entropy(model(x), mg.tensor([0, 1])); line = inspect.currentframe().f_lineno  # noqa: E702
    loss.backward()
    return [loss] + [p.grad for p in model.parameters()], line


def test_a_schedule_read_from_disk_names_the_ops_and_lines_of_its_run():
    needs("c")
    mg.set_backend("c")
    for _ in range(2):          # the second realisation's structure is every later one's: it is stored
        tensors, _ = _small_step(width=7)
        mg.sync(*tensors)
    instance = mg.backend._instance("c")
    instance.schedules.clear()
    instance.functions.clear()
    tensors, line = _small_step(width=7)
    with mg.profile() as prof:
        mg.sync(*tensors)
    assert [e.name for e in prof.events if e.category == "load"][:1] == ["schedule from disk"]
    assert not [e for e in prof.events if e.category == "schedule"] and prof.compiles == 0
    assert {(HERE, line)} <= {ln for k in prof.kernels for ln in k.lines}
    assert {"conv2d", "cross_entropy_backward"} <= {op for k in prof.kernels for op in k.ops}


def test_realising_from_inside_the_package_is_traced_at_an_unknown_line(monkeypatch):
    from metagraph.pipeline import realize
    monkeypatch.setattr(realize, "user_site", lambda frame: ("<unknown>", 0))     # as a bench run finds
    x = mg.tensor(np.ones(5, np.float32))
    with mg.profile() as prof:
        (x * 4.5).numpy()
    (realised,) = [e for e in prof.events if e.category == "realise"]
    assert realised.args["at"] == "<unknown>:0"
    assert provenance.line_of(("<unknown>", 0)) == ("<unknown>", 0)
