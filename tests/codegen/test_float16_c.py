"""The c backend's float16 code: values are bits converted by integer helpers, so that GCC
vectorises float16 loops (it leaves _Float16 conversions scalar, and with them the loop), while
bang and opencl keep their own float16 types. Its golden source is test_golden.py's."""
import re
import subprocess

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen import bang, c, clike, opencl, toolchain
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule

def _kernels(*tensors):
    return [step.kernel for step in schedule(pending_graph([t.node for t in tensors]))]


def _half(*shape):
    return mg.tensor(np.linspace(-4, 4, int(np.prod(shape))).reshape(shape), dtype=mg.float16)


CASES = {
    "elementwise_chain": lambda: F.relu(_half(64) * 1.5 + 0.5) * F.sigmoid(_half(64)),
    "row_sum": lambda: _half(8, 256).sum(1),
    "from_float64": lambda: mg.tensor(np.linspace(-1, 1, 512)).half(),
    "to_float32": lambda: (_half(512) * _half(512)).float(),
}


def _gcc():
    """The C backend's compiler when it is GCC (its -fopt-info report is what is read), else skip."""
    try:
        version = subprocess.run([toolchain.compiler_command(), "--version"], capture_output=True,
                                 text=True, timeout=60).stdout
    except OSError:
        pytest.skip("no C compiler")
    if "Free Software Foundation" not in version:
        pytest.skip("the C compiler is not GCC")
    return toolchain.compiler_command()


@pytest.mark.parametrize("name", sorted(CASES))
def test_float16_loops_carry_no_float16_type_and_vectorise(name, tmp_path):
    kernels = _kernels(CASES[name]())
    source = c.render(kernels)
    body = source[source.index("\nvoid "):]
    assert "_Float16" not in re.sub(r"/\*.*?\*/", "", source, flags=re.S)     # in code, not comments
    assert "uint16_t *" in body and ("mg_f16_to_f32(" in body or "mg_f32_to_f16(" in body
                                     or "mg_f64_to_f16(" in body)
    path = tmp_path / "kernel.c"
    path.write_text(source)
    report = subprocess.run([_gcc(), *toolchain.COMPILE_FLAGS, "-fopt-info-vec-optimized", str(path),
                             "-o", str(tmp_path / "kernel.so")], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    first_kernel_line = source[:source.index("\nvoid ")].count("\n") + 2
    vectorised = [int(line) for line in re.findall(r":(\d+):\d+: optimized: loop vectorized", report.stderr)]
    assert any(line > first_kernel_line for line in vectorised), \
        f"no loop of the kernel vectorised:\n{body}\n{report.stderr[-2000:]}"


def test_bang_and_opencl_keep_their_float16_types():
    """Their renderers derive from the C family's (clike.Renderer), not from the c backend's
    CRenderer: bang's intrinsics select on `_Float16 *`, opencl reads `half` memory."""
    kernel = _kernels(CASES["elementwise_chain"]())[0]
    assert "_Float16 *" in bang.render([kernel])
    assert opencl.POINTER["float16"] == "half" and clike.CTYPE["float16"] == "_Float16"
    assert c.HOST_CTYPE["float16"] == "uint16_t"
    assert "mg_f16_to_f32" not in opencl.Renderer(kernel).convert("x", mg.float16, mg.float32)
