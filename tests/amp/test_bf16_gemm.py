"""The AVX-512 BF16 matmul kernel (codegen/bf16_gemm.py, templates/bf16_gemm.c) called directly:
every packing path (a stride of 1 along k, along the rows or columns, or neither; stride 0 for a
size-1 dimension), odd k, edges narrower than a register tile, column chunks, and the ways threads
share the work (one product split by rows or by column groups, many products one per thread),
against a float64 product of the same bfloat16 values."""
import ml_dtypes
import numpy as np
import pytest

import metagraph as mg
from metagraph.codegen import bf16_gemm
from tests.helpers import needs

SHAPES = [(1, 1, 1), (13, 7, 31), (12, 2, 32), (97, 513, 65), (200, 1030, 100), (5, 1, 40), (24, 64, 4100),
          (24, 1100, 40)]
LAYOUTS = ["rows", "columns", "strided"]     # A: row-major, column-major, every other element; B alike


@pytest.fixture(scope="module")
def kernel():
    if not bf16_gemm.available():
        pytest.skip("this CPU has no AVX-512 BF16 (or no C compiler)")
    return bf16_gemm._function()


def _operand(rng, rows, cols, layout):
    """(bfloat16 values as a rows x cols float64 array, their storage as bits, row and column
    strides in elements); a size-1 dimension has stride 0, as contraction.gemm gives it."""
    values = rng.uniform(-1, 1, (rows, cols)).astype(ml_dtypes.bfloat16)
    if layout == "rows":
        storage, strides = values.reshape(-1), (cols, 1)
    elif layout == "columns":
        storage, strides = values.T.reshape(-1), (1, rows)
    else:
        storage = np.zeros(2 * rows * cols, ml_dtypes.bfloat16)
        storage[::2] = values.reshape(-1)
        strides = (2 * cols, 2)
    strides = tuple(0 if size == 1 else stride for size, stride in zip((rows, cols), strides))
    return values.astype(np.float64), storage.view(np.uint16), strides


def _run(kernel, a_bits, b_bits, out, batch, a_offsets, b_offsets, m, n, k, a_strides, b_strides, threads):
    ffi, entry = kernel
    status = entry(ffi.from_buffer("uint16_t[]", a_bits), ffi.from_buffer("uint16_t[]", b_bits),
                   ffi.from_buffer("float[]", out), batch,
                   ffi.from_buffer("int64_t[]", np.asarray(a_offsets, np.int64)),
                   ffi.from_buffer("int64_t[]", np.asarray(b_offsets, np.int64)),
                   m, n, k, *a_strides, *b_strides, threads)
    assert status == 0


def _assert_close(got, a, b):
    """Within float32's summation bound of the exact products: a skipped, doubled or misplaced
    product is far outside it."""
    want = a @ b
    bound = a.shape[-1] * 2.0 ** -24 * (np.abs(a) @ np.abs(b)) + 1e-30
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_every_packing_path_and_thread_split_gives_the_exact_sums(kernel, m, k, n, threads):
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    for a_layout in LAYOUTS:
        for b_layout in LAYOUTS:
            a, a_bits, a_strides = _operand(rng, m, k, a_layout)
            b, b_bits, b_strides = _operand(rng, k, n, b_layout)
            out = np.full((m, n), np.nan, np.float32)
            _run(kernel, a_bits, b_bits, out, 1, [0], [0], m, n, k, a_strides, b_strides, threads)
            _assert_close(out, a, b)


@pytest.mark.parametrize("batch, threads", [(3, 2), (2, 3), (5, 1)])
def test_batched_products_read_each_entry_at_its_offsets(kernel, batch, threads):
    """Products one per thread (batch >= threads) or shared (batch < threads); B broadcast to every
    entry through offsets of 0."""
    rng = np.random.default_rng(batch)
    m, k, n = 40, 70, 48
    a = rng.uniform(-1, 1, (batch, m, k)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, (k, n)).astype(ml_dtypes.bfloat16)
    out = np.full((batch, m, n), np.nan, np.float32)
    _run(kernel, a.view(np.uint16).reshape(-1), b.view(np.uint16).reshape(-1), out, batch,
         [e * m * k for e in range(batch)], [0] * batch, m, n, k, (k, 1), (n, 1), threads)
    for e in range(batch):
        _assert_close(out[e], a[e].astype(np.float64), b.astype(np.float64))


def test_an_empty_sum_writes_zeros_and_an_empty_product_nothing(kernel):
    out = np.full((3, 20), np.nan, np.float32)
    _run(kernel, np.zeros(1, np.uint16), np.zeros(1, np.uint16), out, 1, [0], [0], 3, 20, 0, (0, 0),
         (0, 0), 2)
    assert not out.any()
    untouched = np.full(1, np.nan, np.float32)       # no columns: nothing to allocate or write
    _run(kernel, np.zeros(12, np.uint16), np.zeros(1, np.uint16), untouched, 1, [0], [0], 3, 0, 4, (4, 1),
         (0, 1), 2)
    assert np.isnan(untouched[0])


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_transposed_and_thin_operands_reach_the_kernel(backend):
    """A^T @ B (the kernel packs A from columns), a weight gradient x^T @ dy, and a product with
    fewer rows than the threads' items: one bf16_ step each, within an ulp of the oracle."""
    needs(backend)
    if not bf16_gemm.available():
        pytest.skip("this CPU has no AVX-512 BF16 (or no C compiler)")
    mg.set_backend(backend)
    rng = np.random.default_rng(3)

    def t(*shape):
        return mg.tensor(rng.uniform(-1, 1, shape), dtype=mg.bfloat16)
    for out in (t(70, 33).T @ t(70, 45), t(257, 40).T @ t(257, 64), t(3, 300) @ t(300, 96)):
        want = mg.backend._instance("numpy").realize([out.node])[0]
        with mg.profile() as report:
            got = out.numpy()
        assert any(kernel.name.startswith("bf16_") for kernel in report.kernels), report.table()
        ulps = np.abs(got.view(np.int16).astype(np.int64) - want.view(np.int16).astype(np.int64))
        assert ulps.max() <= 1, (out.shape, ulps.max())
