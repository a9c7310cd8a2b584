"""bfloat16 matmuls through the AVX-512 BF16 dot product: the host kernel in templates/bf16_gemm.c,
compiled once by the system C compiler (and cached like every kernel), for the contractions
compiler/contraction.py finds (`Gemm`). Every backend uses it where the CPU has `avx512_bf16` and a
C compiler works (`available`); elsewhere bfloat16 contractions are generated code, which widens
each operand to float32 (compiler/decompose.py).

Generated code reaches float32's multiply-add rate at best; vdpbf16ps does two bfloat16 products
per lane and instruction, which is where bfloat16's speed comes from on this CPU.
"""
import functools
import os
import shutil

import numpy as np

from metagraph import flags
from metagraph.compiler.contraction import gemm
from metagraph.errors import OutOfMemory

SOURCE = os.path.join(os.path.dirname(__file__), "templates", "bf16_gemm.c")
ENTRY = "mg_bf16_gemm"
DECLARATION = (f"int {ENTRY}(const uint16_t *, const uint16_t *, float *, int64_t, const int64_t *, "
               "const int64_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int);")


def cpu_has_bf16_dot():
    """Whether the CPU reports AVX-512 BF16 (Linux's /proc/cpuinfo flag avx512_bf16)."""
    from metagraph.codegen import toolchain      # (it imports compiled.py, which imports this)
    return "avx512_bf16" in toolchain.cpu_flags().split()


@functools.lru_cache(maxsize=None)
def available():
    """Whether bfloat16 contractions go to the host kernel: the CPU has the instruction and a C
    compiler is there to build it."""
    from metagraph.codegen import toolchain
    return cpu_has_bf16_dot() and shutil.which(toolchain.compiler_command()) is not None


@functools.lru_cache(maxsize=None)
def _function():
    """The compiled entry point (built on first use, then found in the kernel cache)."""
    import cffi

    from metagraph.codegen import toolchain
    from metagraph.runtime.cache import KernelCache
    with open(SOURCE) as stream:
        source = stream.read()
    cache = KernelCache(flags.CACHE_DIR, "bf16_gemm\n" + toolchain.toolchain_identity())
    key = cache.key(source)
    path = cache.find(key)
    if path is None:
        path, _ = cache.build(source, [key], lambda src, out: toolchain.compile_shared(src, out, ("-lm",)))
    ffi = cffi.FFI()
    ffi.cdef(DECLARATION)
    library = ffi.dlopen(path, ffi.RTLD_NOW | ffi.RTLD_NODELETE)   # see toolchain.SharedObjects: OpenMP stays
    return ffi, getattr(library, ENTRY)


def launcher(spec):
    """(fn(arrays, error array), its description) for a bfloat16 LibraryContraction: arrays are the
    float32 output and the two bfloat16 operands, each contiguous in its node's shape."""
    layout = gemm(spec)
    ffi, entry = _function()
    batch = np.indices(layout.batch).reshape(len(layout.batch), -1) if layout.batch else np.zeros((0, 1), int)
    a_offsets = np.ascontiguousarray(np.dot(np.array(layout.a_batch, np.int64), batch), np.int64).reshape(-1)
    b_offsets = np.ascontiguousarray(np.dot(np.array(layout.b_batch, np.int64), batch), np.int64).reshape(-1)
    count = a_offsets.size
    offsets = (ffi.from_buffer("int64_t[]", a_offsets), ffi.from_buffer("int64_t[]", b_offsets))
    sizes = (layout.m, layout.n, layout.k) + layout.a_strides + layout.b_strides
    threads = flags.NUM_THREADS

    def launch(arrays, error):
        out, a, b = arrays
        if layout.swapped:
            a, b = b, a
        status = entry(ffi.from_buffer("uint16_t[]", a), ffi.from_buffer("uint16_t[]", b),
                       ffi.from_buffer("float[]", out), count, *offsets, *sizes, threads)
        if status:
            raise OutOfMemory(f"{spec.name}: the bfloat16 matmul could not allocate its packed panels")
    description = (f"library_op {spec.name}: AVX-512 BF16 matmul ({count} x {layout.m}x{layout.k} @ "
                   f"{layout.k}x{layout.n}) for {spec.subscripts!r}, source {SOURCE}")
    return launch, description
