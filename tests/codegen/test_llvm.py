"""The llvm backend: without an OpenMP runtime outer loops run whole on the calling thread; an
accumulated product is one fused multiply-add, as in the C backend, and a guarded one is made
only where its guard holds."""
import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.ops import table
from tests.helpers import needs


def test_without_libgomp_parallel_loops_run_on_the_calling_thread(tmp_path, monkeypatch):
    needs("llvm")
    from metagraph.codegen.llvm import LLVMBackend
    from metagraph.codegen.llvm_toolchain import Toolchain
    from metagraph.pipeline.realize import Pipeline
    monkeypatch.setattr(mg.flags, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Toolchain, "load_library", lambda self, name: False)
    backend = Pipeline(LLVMBackend())
    x = mg.tensor(np.random.default_rng(0).standard_normal((300, 400)).astype(np.float32))
    out = F.softmax(x * 2 + 1, 1).node                 # its last kernel's outer loop is worth threads
    last = schedule(pending_graph([out]))[-1].kernel
    assert "GOMP_parallel" not in backend.render([last])
    np.testing.assert_allclose(backend.realize([out])[0], NumpyBackend().realize([out])[0],
                               rtol=1e-5, atol=1e-6)


def test_an_accumulated_product_is_one_fused_multiply_add():
    needs("llvm")
    from metagraph.codegen import llvm
    rng = np.random.default_rng(1)
    a, b = (mg.tensor(rng.standard_normal(shape).astype(np.float32)) for shape in ((16, 5), (5, 64)))
    kernel = schedule(pending_graph([(a @ b).node]))[-1].kernel
    source = llvm.render([kernel])
    body = source[source.index(f"define internal void @{kernel.name}"):]
    assert "call float @llvm.fma.f32(" in body and "fmul" not in body
    assert source.count("declare float @llvm.fma.f32(") == 1


def _gathered_input_gradient():
    """A stride-2 conv's input gradient as the scatter of its product (the window's gradient,
    ops/window_gradient.py, set aside: it sums the channels first), which lowering makes a guarded
    gather (compiler/gather.py)."""
    rng = np.random.default_rng(2)
    x = mg.tensor(rng.standard_normal((2, 24, 7, 5)).astype(np.float32), requires_grad=True)
    w = mg.tensor(rng.standard_normal((5, 24, 3, 3)).astype(np.float32), requires_grad=True)
    plain, table.window_gradient = table.window_gradient, lambda *arguments: None
    try:
        (gx,) = mg.grad(F.conv2d(x, w, stride=2, padding=1).sum(), [x])
    finally:
        table.window_gradient = plain
    return next(s.kernel for s in schedule(pending_graph([gx.node])) if s.kernel.name.startswith("g_"))


def test_a_guarded_product_is_a_multiply_add_made_only_where_the_guard_holds():
    # a gathered input gradient: outside the output nothing is added (not 0 * w, nan for w = inf)
    from metagraph.codegen import c
    kernel = _gathered_input_gradient()
    assert "? fmaf(" in c.render([kernel])
    needs("llvm")
    from metagraph.codegen import llvm
    source = llvm.render([kernel])
    body = source[source.index(f"define internal void @{kernel.name}"):]
    assert "call float @llvm.fma.f32(" in body and "fmul" not in body
    fma = body.index("@llvm.fma.f32(")
    assert "select i1" in body[fma:body.index("store float", fma)]    # before the sum is stored
