"""The system C compiler and the shared objects it builds: what the `c` and `bang` backends share
(both render C, compile it with the same flags and load it through cffi).
"""
import ctypes
import functools
import os
import subprocess

import cffi

from metagraph.codegen.compiled import CompileError, launcher
from metagraph.compiler import ir


def compiler_command():
    """The C compiler to use: $CC, else cc."""
    return os.environ.get("CC") or "cc"


# Not -O3: GCC 12.2 at -O3 -march=znver3 miscompiles a conditional sum in an inner loop (the values
# of max(dim) read back through their indices: docs/architecture.md keeps the reproducer). -O2 with
# the vectorizer at its -O3 cost model keeps the vectorisation without those extra loop transforms.
# -fpeel-loops unrolls a register tile's short vector loop completely, so its accumulator lives
# in registers (a hand-written 8x32 matmul 1024^3 tile: 49 GFLOP/s without it, 174 with it).
# -fno-trapping-math: kernels never read the floating-point exception flags, and without it GCC
# will not if-convert an unordered comparison (relu's x > 0 || x != x), so a loop that selects on
# one stays scalar (a padded stride-2 conv input after relu: 7.7 -> 1.5 ms). Values are unchanged.
COMPILE_FLAGS = ["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-fpeel-loops", "-march=native",
                 "-fPIC", "-shared", "-fopenmp", "-fwrapv", "-fno-math-errno", "-fno-trapping-math",
                 "-ffp-contract=off", "-std=gnu11", "-pipe"]


def compile_shared(source_path, output_path, libraries=("-lmvec", "-lm"), include=None):
    """Compile one C file into a shared object; raise CompileError with the compiler's output."""
    command = [compiler_command(), *COMPILE_FLAGS, *([f"-I{include}"] if include else []), source_path,
               "-o", output_path, *libraries]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CompileError(f"could not run the C compiler {command[0]!r}: {error}") from None
    if result.returncode != 0:
        log_path = source_path + ".log"
        with open(log_path, "w") as log:
            log.write(" ".join(command) + "\n" + result.stdout + result.stderr)
        raise CompileError(f"the C compiler failed on {source_path} (its output is in {log_path}):\n"
                           f"{result.stderr[-2000:]}")


def toolchain_identity():
    """What goes into the cache key besides the source: compiler, version, flags, target CPU."""
    return _identity(compiler_command())


@functools.lru_cache(maxsize=None)
def _identity(command):
    """toolchain_identity for one compiler: two compiler runs, worked out once per process (the c
    and bang backends and the bfloat16 GEMM each key their caches by it)."""
    try:
        version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60).stdout
        target = subprocess.run([command, "-march=native", "-Q", "--help=target"], capture_output=True,
                                text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CompileError(f"no working C compiler {command!r}: {error}") from None
    march = [line.split()[-1] for line in target.splitlines() if line.strip().startswith("-march=")]
    return "\n".join([command, version.splitlines()[0] if version else "", " ".join(COMPILE_FLAGS),
                      ",".join(march), cpu_flags()])


@functools.lru_cache(maxsize=None)
def cpu_flags():
    """The CPU's feature flags as Linux reports them (the `flags` line of /proc/cpuinfo), or ""."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


def probe_vector_math(backend):
    """Compile a trivial kernel once, so that a broken compiler is found before any real work;
    without glibc's vector math library (libmvec), math calls stay scalar. Sets the backend's
    `vector_math` and `libraries`."""
    backend.vector_math, backend.libraries = True, ("-lmvec", "-lm")
    try:
        _build_probe(backend)
    except CompileError:
        backend.vector_math, backend.libraries = False, ("-lm",)
        _build_probe(backend)


def _build_probe(backend):
    """Compile (unless the kernel cache has it) and open an empty kernel."""
    source = backend.render([ir.Kernel("probe_kernel", [], [])])
    key = backend.cache.key(source)
    path = backend.cache.find(key) or backend.cache.build(source, [key], backend.compile)[0]
    backend.open(path, "probe_kernel")


class SharedObjects:
    """Kernels in shared objects, loaded through cffi's ABI mode as fn(arrays, error array).

    A shared object is opened with RTLD_NODELETE: it stays mapped until the process ends, and so
    does the OpenMP runtime it links. Otherwise, at interpreter exit, freeing the last library
    object unmaps the runtime while its idle worker threads still spin in its code, and the
    process dies of SIGSEGV after its work is done."""

    def __init__(self):
        self.ffi = cffi.FFI()
        self.opened = {}

    def open(self, path, name):
        """The kernel `name` of shared object `path`, found by ctypes and called through a cffi
        function pointer: declaring each name to cffi instead (a pycparser parse) cost 0.2 ms a
        kernel, a tenth of a second to load ResNet-18's training step."""
        if path not in self.opened:
            self.opened[path] = ctypes.CDLL(path, os.RTLD_NOW | os.RTLD_NODELETE)
        address = ctypes.cast(getattr(self.opened[path], name), ctypes.c_void_p).value
        return launcher(self.ffi, self.ffi.cast("void (*)(char **, int64_t *)", address))
