"""The `llvm` backend: kernel IR rendered to LLVM IR text, compiled and loaded by llvmlite
(codegen/llvm_toolchain.py), object code cached on disk.

The walk over the IR is codegen/walker.py's: `Renderer` spells values as SSA instructions
(`llvm_ops.py`: each op's) and hands `templates/llvm.j2` the structure, which spells it: counted
loops, the blocks around what is computed only where a condition holds, the module's helpers and
intrinsics, entry points and the OpenMP team that runs each outer parallel loop (GOMP_parallel:
a launch costs microseconds, and the team is the C backend's kernels').
"""
from metagraph import flags
from metagraph.codegen.compiled import CompiledBackend, local_only, template, thread_groups
from metagraph.codegen.llvm_ops import CAST, COMBINE, FLOAT_SUFFIX, INDEX, LTYPE, NARROW, OPS, WIDEN, constant
from metagraph.codegen.llvm_toolchain import Toolchain
from metagraph.codegen.walker import Walker, op_form
from metagraph.compiler import ir, prefetch
from metagraph.expr import Var
from metagraph.runtime.cache import KernelCache

_TEMPLATE = template("llvm.j2")


class Renderer(Walker):
    """The walker's constructs as LLVM instructions: each value an SSA name, each op the
    instructions of its table entry, reads that must not happen behind real branches."""
    OPS, INDEX, CAST, WIDEN, NARROW = OPS, INDEX, CAST, WIDEN, NARROW

    def __init__(self, kernel):
        super().__init__(kernel)
        self.counter, self.vars, self.slots, self.allocas, self.block = 0, {}, {}, [], "%entry"

    # ---- plumbing: names, instructions, blocks -------------------------------------------------
    def fresh(self, stem="t"):
        self.counter += 1
        return f"%{stem}{self.counter}"

    def emit(self, text):
        self.lines.append("  " + text)

    def instruction(self, text, stem="t"):
        name = self.fresh(stem)
        self.emit(f"{name} = {text}")
        return name

    def form(self, template, *operands, **fields):
        """A table entry's instructions; the name of the last one's result."""
        results = {}
        for part in template.split("; "):
            results[f"r{len(results)}"] = self.instruction(part.format(*operands, **fields, **results))
        return results[f"r{len(results) - 1}"]

    def apart(self, label, emit):
        """The lines emit() writes from block `label` on, its result and the block it ends in."""
        outer, self.lines, self.block = self.lines, [], label
        result = emit()
        lines, self.lines = self.lines, outer
        return lines, result, self.block

    def jump(self, cond, then, otherwise, join, merge=None):
        """Branch on cond to then() or otherwise() (each emitting its side), both on to a block named
        `join` and numbered as the jump; with `merge` (a type), the name of the value of the side
        taken (the template's phi of their results)."""
        self.counter += 1
        n = self.counter
        sides = [(label, *self.apart(label, side)) for label, side in ((f"%then{n}", then),
                                                                       (f"%else{n}", otherwise))]
        self.lines.append({"kind": "jump", "n": n, "cond": cond, "sides": sides, "type": merge,
                           "join": f"%{join}{n}"})
        self.block = f"%{join}{n}"
        return merge and f"%merge{n}"

    def address(self, target, index):
        """(address, dtype) of element `index` (an i64 operand) of kernel parameter `target` (its
        number) or accumulator `target` (its name; index None: a scalar one)."""
        if isinstance(target, int):
            base, dtype = f"%p{target}", self.params[target].dtype
        else:
            base, dtype = self.slots[target], self.accumulators[target].dtype
        if index is None:
            return base, dtype
        type_ = LTYPE[dtype.name]
        return self.instruction(f"getelementptr inbounds {type_}, ptr {base}, i64 {index}", "a"), dtype

    def read(self, target, index):
        """A parameter's or an accumulator's element."""
        address, dtype = self.address(target, index)
        return self.instruction(f"load {LTYPE[dtype.name]}, ptr {address}")

    def store(self, target, index, v):
        """A parameter's or an accumulator's element set to v."""
        address, dtype = self.address(target, index)
        self.emit(f"store {LTYPE[dtype.name]} {v}, ptr {address}")

    element = read_accumulator = read
    write = write_accumulator = store

    # ---- index expressions and values ----------------------------------------------------------
    def loop_variable(self, axis):
        return self.vars[axis]

    def choose(self, cond, then, otherwise, dtype, lazy):
        type_ = LTYPE[dtype.name]
        if lazy:
            return self.jump(cond, then, otherwise, "join", type_)
        a, b = then(), otherwise()
        return self.instruction(f"select i1 {cond}, {type_} {a}, {type_} {b}")

    def short_circuit(self, op, a, rest):
        if op == "&&":
            return self.jump(a, rest, lambda: "false", "join", "i1")
        return self.jump(a, lambda: "true", rest, "join", "i1")

    def implies(self, valid, cond):
        return self.jump(valid, cond, lambda: "true", "join", "i1")

    def guarded(self, cond, inner, fill, check, dtype):
        if check:
            self.when(cond, lambda: None, check, "ok")
        return self.choose(cond, lambda: inner, lambda: fill, dtype, lazy=False)

    literal = staticmethod(constant)

    def fields(self, source, dtype):
        return {"t": LTYPE[source.name], "rt": LTYPE[dtype.name], "s": FLOAT_SUFFIX.get(dtype.name),
                "one": constant(1, dtype)}

    # ---- statements --------------------------------------------------------------------------
    def define(self, s):
        t, pointer = LTYPE[s.dtype.name], self.fresh(s.name)
        self.slots[s.name] = pointer
        self.allocas.append((pointer, t, s.size))
        if s.size is None:
            self.emit(f"store {t} {constant(s.init, s.dtype)}, ptr {pointer}")
        elif s.init is not None:          # each element assigned its initial value
            element = Var(("init", s.name))
            fill = ir.Assign(s.name, element, ir.Scalar(s.init, s.dtype))
            self.loop(ir.Loop(element.axis, s.size, ir.VECTOR, [fill]), {})

    def combine(self, op, a, b, dtype):
        return self.form(op_form(COMBINE, op, dtype), a, b, **self.fields(dtype, dtype))

    def when(self, cond, update, check, join="next"):
        fail = (lambda: self.emit(f"store i64 {check}, ptr %err")) if check else (lambda: None)
        self.jump(cond, update, fail, join)

    def loop(self, s, names, start="0", end=None):
        """A counted loop over [start, end) (a thread's share) when `end` is given, else over
        [0, extent)."""
        if s.extent <= 0:
            return
        var = self.fresh(f"i{s.var}." if isinstance(s.var, int) else "q")
        n = self.counter
        node = {"kind": "loop", "n": n, "var": var, "start": start, "end": end or str(s.extent),
                "before": self.block, "enter": end is not None}
        saved, self.vars[s.var] = self.vars.get(s.var), var
        node["body"] = self.apart(f"%loop{n}", lambda: self.fetch_ahead(s) or self.each(s.body))[0]
        self.lines.append(node)
        self.vars[s.var], self.block = saved, f"%done{n}"

    def fetch_ahead(self, s):
        """Prefetches of the lines a reduction loop reads a few iterations ahead (compiler/prefetch.py)."""
        for param, index in prefetch.ahead(s, self.params):
            address, _ = self.address(param, self.index(index))
            self.emit(f"call void @llvm.prefetch.p0(ptr {address}, i32 0, i32 3, i32 1)")

    def each(self, statements):
        for s in statements:
            self.statement(s)

    def groups(self):
        """Top-level statements as body functions: each outer loop worth threads on its own. The
        statements before a threaded loop that define local arrays or accumulators (a sum hoisted
        out of it, a packed operand) open that loop's function instead: each thread computes them
        for its share (the functions hold their own allocas, so the loop could not read them from
        a function apart; the threads compute them at once, so the time is the same)."""
        groups, prefix = [], []
        for loop, statements in thread_groups(self.kernel.body):
            if loop is None and local_only(statements):
                prefix += statements
                continue
            self.lines, self.allocas, self.block = [], [], "%entry"
            self.each(prefix + (statements or []))
            if loop is not None:
                self.loop(loop, {}, "%start", "%end")
            groups.append({"extent": loop and loop.extent, "lines": self.lines, "allocas": self.allocas})
            prefix = []
        if prefix:
            self.lines, self.allocas, self.block = [], [], "%entry"
            self.each(prefix)
            groups.append({"extent": None, "lines": self.lines, "allocas": self.allocas})
        return groups


def render(kernels, openmp=True):
    """LLVM IR for a batch of kernels (openmp: outer loops run in an OpenMP team)."""
    views = [{"name": kernel.name, "groups": Renderer(kernel).groups(),
              "params": [{"output": p.output, "shared": p.shared} for p in kernel.params]}
             for kernel in kernels]
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels],
                            openmp=openmp and flags.NUM_THREADS > 1, threads=flags.NUM_THREADS)


class LLVMBackend(CompiledBackend):
    """Kernels as LLVM IR, compiled in-process by llvmlite, loaded into MCJIT."""
    name = "llvm"
    host_memory = True       # bfloat16 matmuls through codegen/bf16_gemm.py
    comment = ";"
    # one compile at a time: with an LLVM context and target machine per thread, a cold ResNet-18
    # compiled no faster (7.9 s against 7.6 s; llvmlite serialises its calls)
    compile_jobs = 1
    # LLVM spills a tile of 32 accumulators plus its shared operand (matmul 1024^3: 47 GFLOP/s at
    # 32, 139-182 at 28 and below; gcc keeps 32 and reads the operand from memory)
    accumulator_registers = 28

    def __init__(self):
        self.toolchain = Toolchain()
        super().__init__(KernelCache(flags.CACHE_DIR, self.toolchain.identity, ".ll", ".o"))

    def render(self, kernels):
        return render(kernels, self.toolchain.openmp)

    def compile(self, source_path, binary_path):
        self.toolchain.compile(source_path, binary_path)

    def open(self, path, name):
        return self.toolchain.open(path, name)
