"""The `bang` backend: kernel IR rendered to BANG-style kernels for scratchpad accelerators.

A kernel is an `__mlu_entry__` function run once per task. Its outer parallel loop is shared out
by taskId/taskDim; every innermost loop is cut into tiles of TILE lanes; each tile moves its
operands from global memory into `__nram__` buffers with explicit `__memcpy` (contiguous or
strided; `__gather` where an address is not affine in the lane), computes with `__bang_*` vector
intrinsics on whole tiles, reduces with a reduction intrinsic, and writes back with `__memcpy`
(`__scatter`/`__scatter_<op>` for scatters). TILE is sized so that every buffer of the kernel
fits the configured on-chip capacity (METAGRAPH_BANG_NRAM). Values that do not change along the
tile (a matmul's row element, a conv weight) are scalars moved by a one-element `__memcpy`.

No MLU toolchain exists here: `templates/bang_host.h` implements exactly the intrinsics used, and
the task loop, in plain C, so the kernels compile with the system C compiler and run on the CPU.
"""
import hashlib
import os

from metagraph import dtypes, flags
from metagraph.codegen import c
from metagraph.codegen.bang_ops import BOOL_REDUCE, BOOL_VECTOR, NAME, REDUCE, SCATTER, VECTOR, VectorOps
from metagraph.codegen.compiled import CompiledBackend, template, thread_groups
from metagraph.codegen.toolchain import SharedObjects, compile_shared, probe_vector_math, toolchain_identity
from metagraph.codegen.walker import Walker, op_form
from metagraph.compiler import ir
from metagraph.errors import MetagraphError
from metagraph.expr import Binary, Var, linear_terms, variables
from metagraph.runtime.cache import KernelCache

CTYPE = c.CTYPE
TILE_ALIGN = 64          # lanes per tile are a multiple of this (a 128- or 256-byte vector on chip)
HEADER = os.path.join(os.path.dirname(__file__), "templates", "bang_host.h")


def _affine(expr, var):
    """The coefficient of loop variable `var` when expr = coefficient * var + (terms without var)."""
    terms, _ = linear_terms(expr)
    coefficient = 0
    for term, coef in terms.items():
        if isinstance(term, Var) and term.axis == var:
            coefficient += coef
        elif var in variables(term):
            return None
    return coefficient


def _tileable(loop):
    """Whether a loop's iterations can be lanes of a tile: no inner loops and no accumulator
    defined per iteration."""
    return not any(isinstance(b, (ir.Loop, ir.Define)) for b in loop.body)


def _conjuncts(cond):
    if isinstance(cond, Binary) and cond.op == "&&":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


class Renderer(VectorOps, c.Renderer):
    """Renders one kernel's IR to BANG C; scalar math and index arithmetic come from the C renderer."""

    def __init__(self, kernel):
        super().__init__(kernel)
        self.lines, self.depth = [], 1
        self.nram = []                  # (dtype, name, size or None for TILE lanes)
        self.var = None                 # the loop variable along the tile (None: a single lane)
        self.at_lane = False            # render the tiled variable at a lane, not at the tile start
        self.spreads = {}               # uniform value -> its buffer, in the current statement
        self.extent = 1                 # longest tiled loop

    # ---- plumbing --------------------------------------------------------------------------
    def emit(self, line):
        self.lines.append("    " * self.depth + line)

    def buffer(self, dtype, size=None, stem="nram"):
        """A new NRAM buffer of TILE lanes (or `size` elements); dtype None: int64 offsets."""
        name = f"{stem}{len(self.nram)}"
        self.nram.append((dtype or dtypes.int64, name, size))
        return name

    def lane_loop(self, lines):
        """A loop over the tile's lanes with the lane's own value of the tiled variable (index
        arithmetic and NRAM only)."""
        v = self.var
        self.emit("for (int64_t lane = 0; lane < lanes; lane++) {")
        self.depth += 1
        if v is not None:
            self.emit(f"const int64_t i{v}_lane = i{v} + lane;")
        for line in lines:
            self.emit(line)
        self.depth -= 1
        self.emit("}")

    def loop_variable(self, axis):
        return f"i{axis}_lane" if self.at_lane and axis == self.var else f"i{axis}"

    def at(self, expr):
        """An index expression at the current lane (inside lane_loop)."""
        self.at_lane = True
        try:
            return self.index(expr)
        finally:
            self.at_lane = False

    def depends(self, expr):
        return self.var is not None and self.var in variables(expr)

    def varies(self, value):
        """Whether a value changes along the tile."""
        return self.var is not None and any(self.depends(expr) for v in ir.values(value)
                                            for expr in ir.index_expressions(v))

    def interval(self, cond):
        """(lo, hi) C expressions: the lanes where cond holds, when it is a conjunction of affine
        comparisons in the tiled variable; else None."""
        lo, hi = "0", "lanes"
        for part in _conjuncts(cond):
            if not isinstance(part, Binary) or part.op not in ("<", "<="):
                return None
            difference = part.a - part.b if part.op == "<" else part.a - part.b - 1   # difference < 0
            coef = _affine(difference, self.var)
            if coef is None:
                return None
            # difference(lane) = difference(tile start) + coef * lane < 0
            start = self.index(difference)
            if coef > 0:
                hi = f"MG_MIN({hi}, mg_floordiv(-({start}) - 1, {coef}) + 1)"
            elif coef < 0:
                lo = f"MG_MAX({lo}, mg_floordiv({start}, {-coef}) + 1)"
            else:
                hi = f"(({start}) < 0 ? {hi} : 0)"
        return lo, hi

    # ---- values ----------------------------------------------------------------------------
    def load(self, value):
        """A load of a value that is the same on every lane (those are the walker's, spelt as C):
        one element, moved by __memcpy into an NRAM slot (nothing moved where `valid` is false)."""
        stored = self.params[value.param].dtype       # float16 or bfloat16 read as float32
        slot = self.buffer(stored, 1, "slot")
        copy = f"__memcpy({slot}, p{value.param} + {self.index(value.index)}, " \
               f"sizeof({CTYPE[stored.name]}), GDRAM2NRAM);"
        if value.valid is None:
            self.emit(copy)
        else:
            self.emit(f"{slot}[0] = 0;")
            self.emit(f"if ({self.condition(value.valid)}) {copy}")
        return self.convert(f"{slot}[0]", stored, value.dtype)

    def combine(self, target, op, v, dtype):
        return op_form(c.COMBINE, op, dtype).format(target, v)

    def lanes(self, value, names):
        """A value along the tile: an NRAM buffer name (or a uniform scalar's C expression, with
        is_buffer False)."""
        if not self.varies(value):
            return self.value(value, names), False
        if id(value) in names:
            return names[id(value)], True
        out = self.buffer(value.dtype) if not isinstance(value, ir.Ref) else None
        if isinstance(value, ir.Load):
            self.load_tile(value, out)
        elif isinstance(value, ir.IndexValue):
            self.lane_loop([f"{out}[lane] = ({CTYPE[value.dtype.name]})({self.at(value.expr)});"])
        elif isinstance(value, ir.Ref):
            if _affine(value.index, self.var) == 1:    # the accumulator's slice is the buffer
                out = f"({value.name} + {self.index(value.index)})"
            else:
                out = self.buffer(value.dtype)
                self.lane_loop([f"{out}[lane] = {value.name}[{self.at(value.index)}];"])
        elif isinstance(value, ir.Guard):
            self.guard_tile(value, out, names)
        else:
            self.compute(value, out, names)
        names[id(value)] = out
        return out, True

    def spread(self, operand, dtype):
        """An operand as a buffer: a uniform scalar is written to every lane."""
        text, is_buffer = operand
        if is_buffer:
            return text
        key = (text, dtype)
        if key not in self.spreads:
            self.spreads[key] = self.buffer(dtype)
            self.emit(f"__bang_write_value({self.spreads[key]}, lanes, ({CTYPE[dtype.name]}){text});")
        return self.spreads[key]

    def load_tile(self, value, out):
        stored = self.kernel.params[value.param].dtype
        if stored != value.dtype:       # float16 or bfloat16 read as float32: moved, then converted
            moved = self.buffer(stored)
            self.load_tile(ir.Load(value.param, value.index, stored, value.valid), moved)
            self.emit(f"__bang_{NAME[stored.name]}2{NAME[value.dtype.name]}({out}, {moved}, lanes);")
            return
        ctype, param = CTYPE[value.dtype.name], f"p{value.param}"
        coef = _affine(value.index, self.var)
        interval = None
        if coef is not None and value.valid is not None:
            interval = self.interval(value.valid)
        if coef is None or (value.valid is not None and interval is None):
            offsets = self.buffer(None, stem="offsets")
            where = self.at(value.valid) if value.valid is not None else None
            at = self.at(value.index)
            self.lane_loop([f"{offsets}[lane] = {f'{where} ? {at} : -1' if where else at};"])
            self.emit(f"__gather({out}, {param}, {offsets}, sizeof({ctype}), lanes);")
            return
        start = self.index(value.index)
        first, count = "0", "lanes"
        if interval is not None:
            first, last = interval
            self.emit(f"__bang_write_zero({out}, lanes);")
            self.emit(f"{{ const int64_t lo = {first}, hi = {last};")
            self.depth += 1
            first, count = "lo", "(hi - lo)"
            self.emit("if (hi > lo)")
        source = f"{param} + ({start}) + {coef} * {first}" if first != "0" else f"{param} + ({start})"
        target = f"{out} + {first}" if first != "0" else out
        if coef == 1:
            self.emit(f"__memcpy({target}, {source}, {count} * sizeof({ctype}), GDRAM2NRAM);")
        else:
            self.emit(f"__memcpy({target}, {source}, sizeof({ctype}), GDRAM2NRAM, sizeof({ctype}), "
                      f"{coef} * (int64_t)sizeof({ctype}), {count} - 1);")
        if interval is not None:
            self.depth -= 1
            self.emit("}")

    def guard_tile(self, value, out, names):
        inner = self.spread(self.lanes(value.value, names), value.dtype)
        ctype, fill = CTYPE[value.dtype.name], self.literal(value.fill, value.dtype)
        self.emit(f"__memcpy({out}, {inner}, lanes * sizeof({ctype}), NRAM2NRAM);")
        interval = self.interval(value.cond) if value.check is None else None
        if interval is not None:
            self.emit(f"{{ const int64_t lo = {interval[0]}, hi = MG_MAX(lo, {interval[1]});")
            self.emit(f"  __bang_write_value({out}, lo, {fill});")
            self.emit(f"  __bang_write_value({out} + hi, lanes - hi, {fill}); }}")
            return
        outside = f"!({self.at(value.cond)})"
        if value.valid is not None:
            outside = f"{self.at(value.valid)} && {outside}"
        fail = f" *err = {value.check};" if value.check else ""
        self.lane_loop([f"if ({outside}) {{ {out}[lane] = {fill};{fail} }}"])

    # ---- statements --------------------------------------------------------------------------
    def statement(self, s, names=None):
        """A statement through the walker's dispatch, but stores and assignments (along a tile or
        of one lane) by this backend's own."""
        names, self.spreads = {}, {}
        if isinstance(s, (ir.Store, ir.Assign)):
            return (self.store if isinstance(s, ir.Store) else self.assign)(s, names)
        return Walker.statement(self, s, names)

    def loop(self, s, names):
        if _tileable(s):
            return self.tiles(s, "0", "1")
        self.emit(f"for (int64_t i{s.var} = 0; i{s.var} < {s.extent}; i{s.var}++) {{")
        self.block(s.body)
        self.emit("}")

    def define(self, s):
        if s.size is None:
            self.emit(f"{CTYPE[s.dtype.name]} {s.name} = {self.literal(s.init, s.dtype)};")
            return
        self.nram.append((s.dtype, s.name, s.size))
        if s.init is not None:
            self.emit(f"__bang_write_value({s.name}, {s.size}, {self.literal(s.init, s.dtype)});")

    def block(self, statements):
        self.depth += 1
        for s in statements:
            self.statement(s)
        self.depth -= 1

    def tiles(self, loop, first, step):
        """An innermost loop as tiles of TILE lanes (the task's share when step is taskDim)."""
        v = loop.var
        self.extent = max(self.extent, loop.extent)
        start = "0" if first == "0" else f"{first} * TILE"
        stride = "TILE" if step == "1" else f"{step} * TILE"
        self.emit(f"for (int64_t i{v} = {start}; i{v} < {loop.extent}; i{v} += {stride}) {{")
        self.depth += 1
        self.emit(f"const int64_t lanes = MG_MIN(TILE, {loop.extent} - i{v});")
        saved, self.var = self.var, v
        for s in loop.body:
            self.statement(s)
        self.var = saved
        self.depth -= 1
        self.emit("}")

    def accumulation(self, s, names):
        define = self.accumulators[s.name]
        value, is_buffer = self.lanes(s.value, names)
        if self.var is None:
            target = s.name if s.index is None else f"{s.name}[{self.index(s.index)}]"
            self.emit(self.combine(target, s.op, value, define.dtype))
            return
        buffer = self.converted(self.spread((value, is_buffer), s.value.dtype), s.value.dtype, define.dtype)
        if s.index is None:
            result = self.buffer(define.dtype, 1, "slot")
            table = BOOL_REDUCE if define.dtype == dtypes.bool_ else REDUCE
            self.emit(f"{table[s.op]}({result}, {buffer}, lanes);")
            self.emit(self.combine(s.name, s.op, f"{result}[0]", define.dtype))
        elif _affine(s.index, self.var) == 1:
            table = BOOL_VECTOR if define.dtype == dtypes.bool_ else VECTOR
            target = f"{s.name} + {self.index(s.index)}"
            self.emit(f"{table[s.op]}({target}, {target}, {buffer}, lanes);")
        else:
            self.lane_loop([self.combine(f"{s.name}[{self.at(s.index)}]", s.op, f"{buffer}[lane]",
                                         define.dtype)])

    def assign(self, s, names):
        ctype = CTYPE[self.accumulators[s.name].dtype.name]
        if self.var is None:
            self.emit(f"{s.name}[{self.index(s.index)}] = {self.value(s.value, names)};")
            return
        buffer = self.spread(self.lanes(s.value, names), s.value.dtype)
        if _affine(s.index, self.var) == 1:
            self.emit(f"__memcpy({s.name} + {self.index(s.index)}, {buffer}, lanes * sizeof({ctype}), "
                      "NRAM2NRAM);")
        else:
            self.lane_loop([f"{s.name}[{self.at(s.index)}] = {buffer}[lane];"])

    def store(self, s, names):
        param = self.kernel.params[s.param]
        ctype = CTYPE[param.dtype.name]
        buffer = self.spread(self.lanes(s.value, names), param.dtype) if self.var is not None else None
        if buffer is None:
            slot = self.buffer(param.dtype, 1, "slot")
            self.emit(f"{slot}[0] = {self.value(s.value, names)};")
            self.emit(f"__memcpy(p{s.param} + {self.index(s.index)}, {slot}, sizeof({ctype}), NRAM2GDRAM);")
            return
        coef = _affine(s.index, self.var)
        target = f"p{s.param} + ({self.index(s.index)})"
        if coef == 1:
            self.emit(f"__memcpy({target}, {buffer}, lanes * sizeof({ctype}), NRAM2GDRAM);")
        elif coef is not None and coef != 0:
            self.emit(f"__memcpy({target}, {buffer}, sizeof({ctype}), NRAM2GDRAM, "
                      f"{coef} * (int64_t)sizeof({ctype}), sizeof({ctype}), lanes - 1);")
        else:
            offsets = self.buffer(None, stem="offsets")
            self.lane_loop([f"{offsets}[lane] = {self.at(s.index)};"])
            self.emit(f"__scatter(p{s.param}, {buffer}, {offsets}, sizeof({ctype}), lanes);")

    def scatter(self, s, names):
        param = self.kernel.params[s.param]
        # the value comes in float32 for float16 and bfloat16 memory (compiler/decompose.py): it
        # is rounded to the memory's type, and the scatter adds in float32 and rounds back
        if self.var is None:
            value = self.value(s.value, names)
            value = self.convert(value, s.value.dtype, param.dtype)
            buffer = self.buffer(param.dtype, 1, "slot")
            self.emit(f"{buffer}[0] = {value};")
        else:
            buffer = self.converted(self.spread(self.lanes(s.value, names), s.value.dtype), s.value.dtype,
                                    param.dtype)
        offsets = self.buffer(None, None if self.var is not None else 1, "offsets")
        at = self.at(s.index)
        if s.valid is None:
            line = f"{offsets}[lane] = {at};"
        else:
            fail = f" *err = {s.check};" if s.check else ""
            line = f"if ({self.at(s.valid)}) {offsets}[lane] = {at}; else {{ {offsets}[lane] = -1;{fail} }}"
        if self.var is None:
            self.emit("{ const int64_t lanes = 1;")
            self.lane_loop([line])
            self.emit("}")
            count = "1"
        else:
            self.lane_loop([line])
            count = "lanes"
        function = "__scatter_bor" if param.dtype == dtypes.bool_ else SCATTER[s.op]
        self.emit(f"{function}(p{s.param}, {buffer}, {offsets}, {count});")

    # ---- the kernel --------------------------------------------------------------------------
    def body(self):
        """The entry function's statements: outer loops shared by tasks, the rest on task 0."""
        for k, (loop, statements) in enumerate(thread_groups(self.kernel.body)):
            if k:
                self.emit("__sync_all();")
            if loop is None:
                self.emit("if (taskId == 0) {")
                self.block(statements)
                self.emit("}")
            elif not _tileable(loop):
                self.emit(f"for (int64_t i{loop.var} = taskId; i{loop.var} < {loop.extent}; "
                          f"i{loop.var} += taskDim) {{")
                self.block(loop.body)
                self.emit("}")
            else:
                self.tiles(loop, "taskId", "taskDim")
        return self.lines

    def tile(self, capacity):
        """Lanes per tile: every buffer of the kernel fits `capacity` bytes of NRAM."""
        fixed = sum(dtype.itemsize * size for dtype, _, size in self.nram if size is not None)
        per_lane = sum(dtype.itemsize for dtype, _, size in self.nram if size is None)
        if fixed + per_lane > capacity:
            raise MetagraphError(f"bang: kernel {self.kernel.name} needs {fixed + per_lane} bytes of NRAM "
                                 f"for a single lane; METAGRAPH_BANG_NRAM is {capacity}")
        lanes = (capacity - fixed) // max(per_lane, 1)
        wanted = -(-self.extent // TILE_ALIGN) * TILE_ALIGN
        if lanes >= TILE_ALIGN:
            lanes = lanes // TILE_ALIGN * TILE_ALIGN
        return max(1, min(lanes, wanted))


_TEMPLATE = template("bang.j2")


def render(kernels, capacity=None, vector_math=False):
    """BANG C for a batch of kernels, each tiled for `capacity` bytes of NRAM (vector_math: the
    host header may declare libmvec's SIMD math functions)."""
    capacity = capacity or flags.BANG_NRAM
    views = []
    for kernel in kernels:
        renderer = Renderer(kernel)
        lines = renderer.body()
        tile = renderer.tile(capacity)
        nram = [(CTYPE[dtype.name], name, size) for dtype, name, size in renderer.nram]
        nram_bytes = sum(dtype.itemsize * (size if size is not None else tile)
                         for dtype, _, size in renderer.nram)
        views.append({"name": kernel.name, "lines": lines, "tile": tile, "nram": nram,
                      "nram_bytes": nram_bytes,
                      "params": [{"ctype": CTYPE[p.dtype.name], "output": p.output} for p in kernel.params]})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], tasks=flags.NUM_THREADS,
                            capacity=capacity, vector_math=vector_math)


class BangBackend(CompiledBackend):
    """BANG-style kernels compiled for the CPU through the host header and the system C compiler."""
    name = "bang"
    host_memory = True       # bfloat16 matmuls through codegen/bf16_gemm.py

    def __init__(self):
        with open(HEADER, "rb") as stream:
            header = hashlib.sha256(stream.read()).hexdigest()
        identity = f"bang\n{header}\n{toolchain_identity()}"
        super().__init__(KernelCache(flags.CACHE_DIR, identity, ".bang.c", ".so"))
        self.objects = SharedObjects()
        probe_vector_math(self)

    def render(self, kernels):
        return render(kernels, vector_math=self.vector_math)

    def compile(self, source_path, binary_path):
        compile_shared(source_path, binary_path, self.libraries, include=os.path.dirname(HEADER))

    def open(self, path, name):
        return self.objects.open(path, name)
