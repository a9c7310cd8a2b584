"""The `c` backend: kernel IR rendered to C99 + OpenMP, compiled by the system C compiler, loaded
through cffi (codegen/toolchain.py: one shared object per batch of new kernels, one compiler call).

The walk over the IR is codegen/walker.py's, spelt as C by codegen/clike.py (the op table, values,
statements, loops), which the opencl and bang backends share. What is the c backend's own is
here: the OpenMP pragmas (threads for outer loops, SIMD and reduction clauses for inner ones),
float16 held as its bits (converted by c_helpers.j2's integer helpers), and `templates/c.j2`, the
file's structure (helpers, vector math declarations, signatures).
"""
from metagraph import dtypes, flags
from metagraph.codegen.clike import CTYPE, OPS, Renderer, bits_literal
from metagraph.codegen.compiled import PARALLEL_WORK, CompiledBackend, template, work, worth_threads
from metagraph.compiler.generic import OUTER, RuntimeExtent, runtime_loop
from metagraph.codegen.toolchain import SharedObjects, compile_shared, probe_vector_math, toolchain_identity
from metagraph.codegen.walker import op_form
from metagraph.compiler import ir, prefetch
from metagraph.runtime.cache import KernelCache

# the c backend's types (bang's and opencl's renderers keep CTYPE): float16 is its bits, as bfloat16 is.
# GCC 12 converts _Float16 one element at a time and leaves the loop scalar (a*b + sigmoid(a) over
# 1M, one thread: 17.0 ms CPU time); c_helpers.j2's conversions are integer ops it vectorises (4.6)
HOST_CTYPE = dict(CTYPE, float16="uint16_t")
# the OpenMP reduction clause's operator of an accumulation
REDUCTION = {"add": "+", "mul": "*", "max": "max", ("add", "bool"): "|", ("mul", "bool"): "&",
             ("max", "bool"): "|"}


class CRenderer(Renderer):
    """The c backend's spelling: C's (clike.Renderer), with OpenMP pragmas, and float16 held as its
    bits, as bfloat16 is, converted by c_helpers.j2's integer helpers (bang's and opencl's renderers
    keep _Float16: bang's intrinsics select on `_Float16 *`, opencl's memory is `half`)."""
    OPS, TYPES = OPS, HOST_CTYPE
    WIDEN = {**Renderer.WIDEN, "float16": "mg_f16_to_f32({0})"}
    # float64 to float16 directly (rounded once, as numpy rounds it: through float32 could round twice)
    NARROW = {**Renderer.NARROW, "float16": "mg_f32_to_f16({0})",
              ("float16", "float64"): "mg_f64_to_f16({0})"}

    def __init__(self, kernel):
        super().__init__(kernel)
        # a float16 rounded from a float32 (its rendering) -> the float32. Read back as float32
        # (each op on float16 is rounded so: compiler/decompose.py) it is mg_round_f16 of that,
        # not a narrowing and a widening (a*b + sigmoid(a) over 1M: 7.4 -> 4.5 ms)
        self.narrowed_from = {}

    def literal(self, value, dtype):
        return bits_literal(value, dtype) if dtype == dtypes.float16 else super().literal(value, dtype)

    def bind(self, text, value):
        """No temporary for a narrowing: most are only read back as float32 (mg_round_f16), and
        GCC computes a repeated one once."""
        return text if text in self.narrowed_from else super().bind(text, value)

    def from_storage(self, x, dtype):
        if x in self.narrowed_from:
            return f"mg_round_f16({self.narrowed_from[x]})"
        return super().from_storage(x, dtype)

    def to_storage(self, wide, dtype):
        narrow = super().to_storage(wide, dtype)
        if dtype == dtypes.float16:
            self.narrowed_from[narrow] = wide
        return narrow

    def loop(self, s, names):
        """A loop's view. A reduction loop's body starts with the prefetches of what it reads a few
        iterations ahead (compiler/prefetch.py). A parallel loop over a run-time extent shares its
        threads with the loop right inside it (`collapse(2)`), where that loop is all its body: a
        kernel scheduled for NOMINAL rows (compiler/generic.py) runs on every core at a batch of
        one too."""
        view = super().loop(s, names)
        fetches = prefetch.ahead(s, self.params) if view["kind"] == "loop" else []
        if fetches:         # (sums and products of variables: their text needs no statements)
            lines = [f"__builtin_prefetch(&p{param}[{self.index(index)}], 0, 3);" for param, index in fetches]
            view["body"] = [{"kind": "lines", "lines": lines}] + view["body"]
        inner = view["body"][0] if view["kind"] == "loop" and len(view["body"]) == 1 else None
        if (view.get("pragma") or "").startswith("parallel") and isinstance(s.extent, RuntimeExtent) and \
                inner is not None and inner["kind"] == "loop" and not (inner["before"] or inner["after"] or
                                                                       inner["pragma"]):
            view["pragma"] = view["pragma"].replace("schedule(static)", "collapse(2) schedule(static)")
        return view

    def pragma(self, loop):
        """Threads for outer loops worth them, SIMD for vector loops and reductions, with a
        reduction clause for each scalar accumulator (and for a float max's NaN flag)."""
        if loop.kind == ir.VECTOR:
            return "simd"
        if loop.kind == ir.REDUCE and self.reduced(loop):
            clauses = ["simd"]
            for name in self.reduced(loop):
                acc = self.accumulators[name]
                clauses.append(f"reduction({op_form(REDUCTION, acc.op, acc.dtype)}:{name})")
                if acc.op == "max" and acc.dtype.is_float:
                    clauses.append(f"reduction(|:{name}_nan)")
            return " ".join(clauses)
        if loop.kind == ir.SHARED_SUM:
            return self.shared_sum(loop)
        if flags.NUM_THREADS < 2 or loop.kind != ir.PARALLEL:     # (a team of one costs 0.4 us a launch)
            return None
        threads = f"parallel for schedule(static) num_threads({flags.NUM_THREADS})"
        runtime = runtime_loop(loop)
        if runtime is not None:     # worth threads at the run-time extent, maybe not at every one
            return f"{threads} if({runtime.extent!r} * {work(loop, runtime=1)} >= {PARALLEL_WORK})"
        return threads if worth_threads(loop) else None

    def shared_sum(self, loop):
        """Threads for a loop of sums (ir.SHARED_SUM) worth them: OpenMP's reduction clause gives
        each thread its own copy of the accumulators the loop adds into (an array's as a section).
        A loop not worth them keeps the pragma it has as a plain loop (a reduction's own: simd)."""
        own = all(isinstance(s, ir.Accumulate) and s.index is None for s in loop.body)   # a reduction's own
        alone = self.pragma(ir.Loop(loop.var, loop.extent, ir.REDUCE if own else ir.SERIAL, loop.body))
        if flags.NUM_THREADS < 2 or loop.extent < 2 or work(loop) < PARALLEL_WORK:
            return alone
        inner = {s.name for s in ir.statements(loop.body) if isinstance(s, ir.Define)}
        names = dict.fromkeys(s.name for s in ir.statements(loop.body)
                              if isinstance(s, ir.Accumulate) and s.name not in inner)
        clauses = []
        for name in names:
            acc = self.accumulators[name]
            section = "" if acc.size is None else f"[:{acc.size}]"
            clauses.append(f"reduction({op_form(REDUCTION, 'add', acc.dtype)}:{name}{section})")
        simd = " simd" if alone else ""
        return f"parallel for{simd} schedule(static) num_threads({flags.NUM_THREADS}) {' '.join(clauses)}"


_TEMPLATE = template("c.j2")


def render(kernels, vector_math=True):
    """C source for a batch of kernels (vector_math: declare libmvec's SIMD math functions)."""
    views = []
    for kernel in kernels:
        renderer = CRenderer(kernel)
        params = [{"ctype": HOST_CTYPE[p.dtype.name], "output": p.output, "shared": p.shared}
                  for p in kernel.params]
        outer = len(kernel.params) if isinstance(kernel.extents.get(0), RuntimeExtent) else None
        body = [renderer.statement(s) for s in kernel.body]
        if kernel.fallback:         # (generic.with_fallback: a body for fewer rows than the groups')
            least, *fallback = kernel.fallback
            body = [{"kind": "if", "cond": f"{OUTER} >= {least}", "body": body},
                    {"kind": "if", "cond": f"{OUTER} < {least}", "body": [renderer.statement(s) for s in fallback]}]
        views.append({"name": kernel.name, "params": params, "outer": outer, "body": body})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], vector_math=vector_math)


class CBackend(CompiledBackend):
    """Kernels as C, compiled by the system C compiler in batches, loaded through cffi."""
    name = "c"
    runtime_extents = True   # a kernel may take its outer extent at run time (compiler/generic.py)
    shared_sums = True       # OpenMP's reduction clause (CRenderer.shared_sum)
    host_memory = True       # bfloat16 matmuls through codegen/bf16_gemm.py

    def __init__(self):
        super().__init__(KernelCache(flags.CACHE_DIR, toolchain_identity()))
        self.objects = SharedObjects()
        probe_vector_math(self)

    def render(self, kernels):
        return render(kernels, self.vector_math)

    def compile(self, source_path, binary_path):
        compile_shared(source_path, binary_path, self.libraries)

    def open(self, path, name):
        return self.objects.open(path, name)
