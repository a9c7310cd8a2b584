"""The `bang` backend: kernel IR rendered to BANG-style kernels for scratchpad accelerators.

A kernel is an `__mlu_entry__` function run once per task. Its outer parallel loop is shared out
by taskId/taskDim; the loops compiler/tiles.py plans as tiles run TILE lanes at a time, each a
tile program: operands moved from global memory into `__nram__` buffers with explicit `__memcpy`
(contiguous or strided; `__gather` where an address is not affine in the lane), `__bang_*` vector
intrinsics on whole tiles (bang_ops.py), reductions by a reduction intrinsic, results written back
with `__memcpy` (`__scatter`/`__scatter_<op>` for scatters). Values that do not change along a
tile (a matmul's row element, a conv weight) are scalars, the walker's spelt as C, moved by
one-element `__memcpy`s. Every decision (which loops are tiles, buffers, strides, valid lanes,
TILE) is the plan's; this file spells scalars and hands the template (`templates/bang.j2`, which
spells each step) the structure.

No MLU toolchain exists here: `templates/bang_host.h` implements exactly the intrinsics used, and
the task loop, in plain C, so the kernels compile with the system C compiler and run on the CPU.
"""
import hashlib
import os

from metagraph import flags
from metagraph.codegen import bang_ops, clike
from metagraph.codegen.compiled import CompiledBackend, local_only, template, thread_groups
from metagraph.codegen.toolchain import SharedObjects, compile_shared, probe_vector_math, toolchain_identity
from metagraph.codegen.walker import op_form
from metagraph.compiler import ir
from metagraph.compiler.tiles import LANES, PER_LANE, Buffer, Plan, Slice
from metagraph.dtypes import DType
from metagraph.expr import Expr
from metagraph.runtime.cache import KernelCache

CTYPE = clike.CTYPE
HEADER = os.path.join(os.path.dirname(__file__), "templates", "bang_host.h")
_TEMPLATE = template("bang.j2")
_MACROS = _TEMPLATE.make_module({"kernels": [], "names": [], "tasks": 1, "capacity": 0, "vector_math": False})


class Renderer(clike.Renderer):
    """Spells one kernel's tile plan: scalars as C (global memory through the plan's slots), each
    statement and step as the template's structure."""

    def __init__(self, kernel, plan):
        super().__init__(kernel)
        self.plan, self.extents = plan, plan.extents
        self.var, self.at_lane = None, False      # the tile's loop variable; render it at the lane
        self.current = None                       # the statement being spelt

    # ---- scalars ---------------------------------------------------------------------------
    def loop_variable(self, axis):
        if axis == LANES.axis:
            return "lanes"
        return f"i{axis}_lane" if self.at_lane and axis == self.var else f"i{axis}"

    def load(self, value):
        """One element, moved by __memcpy into its slot (nothing moved where `valid` is false: 0)
        and read from there."""
        stored = self.params[value.param].dtype       # float16 or bfloat16 read as float32
        slot = self.plan.slot(value).name
        address = f"p{value.param} + {self.index(value.index)}"
        copy = _MACROS.copy(slot, address, 1, 1, CTYPE[stored.name], True)
        if value.valid is None:
            self.emit(copy)
        else:
            self.emit(f"{slot}[0] = 0;")
            self.emit(f"if ({self.condition(value.valid)}) {copy}")
        return self.convert(f"{slot}[0]", stored, value.dtype)

    def write(self, param, index, v):
        stored = self.params[param].dtype
        slot = self.plan.slot(self.current).name
        self.emit(f"{slot}[0] = {v};")
        return _MACROS.copy(slot, f"p{param} + {index}", 1, 1, CTYPE[stored.name], False)

    def combine_memory(self, param, index, op, v, dtype):
        """memory[index] op= v through the scatter intrinsics, as a tile's one lane."""
        stored = self.params[param].dtype
        slot, offset = self.plan.slot(self.current).name, self.plan.slot(self.current, "offset").name
        return f"{slot}[0] = {self.convert(v, dtype, stored)}; {offset}[0] = {index}; " \
               f"{op_form(bang_ops.SCATTER, op, stored)}(p{param}, {slot}, {offset}, 1);"

    widened_update = combine_memory         # the scatter intrinsics widen float16 and bfloat16 themselves

    def define(self, s):
        if s.size is None:
            self.emit(f"{CTYPE[s.dtype.name]} {s.name} = {self.literal(s.init, s.dtype)};")
        elif s.init is not None:          # an NRAM array (the plan's buffer)
            self.emit(f"__bang_write_value({s.name}, {s.size}, {self.literal(s.init, s.dtype)});")

    def accumulate(self, define, index, op, v, dtype):
        return op_form(clike.COMBINE, op, define.dtype).format(self.read_accumulator(define.name, index), v)

    # ---- structure and steps -----------------------------------------------------------------
    def statement(self, s, names=None):
        """A statement as the C renderer's structure (this one's hooks find its slots by it)."""
        self.current = s
        return super().statement(s, names)

    def loop(self, s, names):
        program = self.plan.program(s)
        if program is not None:
            return self.tiles(s, program, tasks=False)
        return {"kind": "loop", "var": s.var, "extent": s.extent, "body": [self.statement(b) for b in s.body]}

    def tiles(self, loop, program, tasks):
        """A tiled loop (the task's share when `tasks`) and its steps."""
        saved, self.var, body = self.var, loop.var, []
        for steps in program:
            names = {}          # a statement's scalars, each computed once
            body.extend(self.step(step, names) for step in steps)
        self.var = saved
        return {"kind": "tiles", "var": loop.var, "extent": loop.extent, "tasks": tasks, "body": body}

    def step(self, step, names):
        """A step as the template spells it: its operands as text, the lines its scalars need
        before it, the intrinsic it calls."""
        self.lines, self.at_lane = [], step.kind in PER_LANE
        view = {key: self.spell(operand, names) for key, operand in step.operands.items()}
        self.at_lane = False
        view.update(kind=step.kind, var=self.var, before=self.lines)
        if step.kind in ("compute", "reduce", "update", "scatter_update"):
            view["function"] = bang_ops.intrinsic(step)
        if step.kind in ("reduce", "update_lanes"):
            view["combine"] = bang_ops.combine(step)
        return view

    def spell(self, operand, names):
        """A step's operand as C: a buffer by name, an index expression (at the lane in a per-lane
        step), a scalar through the walker (`names`: the statement's scalars computed so far)."""
        if isinstance(operand, Buffer):
            return operand.name
        if isinstance(operand, Slice):       # it starts at the tile's start, in a per-lane step too
            at_lane, self.at_lane = self.at_lane, False
            start, self.at_lane = self.index(operand.index), at_lane
            return f"({operand.name} + {start})"
        if isinstance(operand, Expr):
            return self.index(operand)
        if isinstance(operand, tuple):
            return tuple(self.spell(part, names) for part in operand)
        if isinstance(operand, DType):
            return CTYPE[operand.name]
        if isinstance(operand, (ir.Load, ir.Scalar, ir.IndexValue, ir.Apply, ir.Guard, ir.Ref)):
            return self.value(operand, names)
        return operand

    def body(self):
        """The entry function's statements: outer loops shared by tasks, the rest on task 0, but
        for what only fills NRAM arrays (compiled.local_only), which every task computes for its
        own NRAM."""
        nodes = []
        for k, (loop, statements) in enumerate(thread_groups(self.kernel.body)):
            if k:
                nodes.append({"kind": "lines", "lines": ["__sync_all();"]})
            if loop is None and local_only(statements):
                nodes.extend(self.statement(s) for s in statements)
            elif loop is None:
                nodes.append({"kind": "task0", "body": [self.statement(s) for s in statements]})
            elif self.plan.program(loop) is not None:
                nodes.append(self.tiles(loop, self.plan.program(loop), tasks=True))
            else:
                nodes.append({"kind": "tasks", "var": loop.var, "extent": loop.extent,
                              "body": [self.statement(s) for s in loop.body]})
        return nodes


def render(kernels, capacity=None, vector_math=False):
    """BANG C for a batch of kernels, each tiled for `capacity` bytes of NRAM (vector_math: the
    host header may declare libmvec's SIMD math functions)."""
    capacity = capacity or flags.BANG_NRAM
    views = []
    for kernel in kernels:
        plan = Plan(kernel, frozenset(bang_ops.WITH_SCALAR), bang_ops.fused)
        tile = plan.lanes(capacity)
        views.append({"name": kernel.name, "body": Renderer(kernel, plan).body(), "tile": tile,
                      "nram": [(CTYPE[b.dtype.name], b.name, b.size) for b in plan.buffers],
                      "nram_bytes": sum(b.dtype.itemsize * (b.size or tile) for b in plan.buffers),
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
