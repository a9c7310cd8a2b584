"""The `llvm` backend: kernel IR rendered to LLVM IR text, optimised and compiled by llvmlite (O3,
loop and SLP vectorisers, the host CPU's features), object code cached on disk and loaded into an
in-process MCJIT.

The walk over the IR is codegen/walker.py's: `Renderer` spells values as SSA instructions
(`llvm_ops.py`: each op's) and hands `templates/llvm.j2` the structure, which spells it: counted
loops, the blocks around what is computed only where a condition holds, the module's helpers and
intrinsics, entry points and OpenMP trampolines. Each outer parallel loop is a body function over
[start, end) that each thread of an OpenMP team runs a contiguous block of (GOMP_parallel, libgomp
loaded into the process: a launch costs microseconds, and the team is the C backend's kernels');
without libgomp it runs the whole range on the calling thread.
"""
import ctypes
import ctypes.util
import os

import cffi

from metagraph import dtypes, flags
from metagraph.codegen.compiled import CompileError, CompiledBackend, launcher, template, thread_groups
from metagraph.codegen.llvm_ops import COMBINE, FLOAT_SUFFIX, INDEX, LTYPE, OPS, Ops, constant
from metagraph.codegen.walker import Walker, op_form
from metagraph.compiler import ir
from metagraph.expr import Var
from metagraph.runtime.cache import KernelCache

_TEMPLATE = template("llvm.j2")


class Renderer(Ops, Walker):
    """The walker's constructs as LLVM instructions: each value an SSA name, each op the
    instructions of its table entry, reads that must not happen behind real branches."""
    OPS, INDEX = OPS, INDEX

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
        """Branch on cond to then() or otherwise() (each emitting its side), both on to `join`; with
        `merge` (a type), the name of the value of the side taken (a phi of their results)."""
        sides = [(self.fresh("then"), then), (self.fresh("else"), otherwise)]
        sides = [(label, *self.apart(label, side)) for label, side in sides]
        node = {"kind": "jump", "cond": cond, "sides": sides, "join": join, "type": merge,
                "merge": merge and self.fresh()}
        self.lines.append(node)
        self.block = join
        return node["merge"]

    def branch(self, cond, then, otherwise, type_):
        """`then()` where cond holds, else `otherwise()`: each computed only on its own side."""
        return self.jump(cond, then, otherwise, self.fresh("join"), type_)

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

    def integer(self, value):
        return str(value)

    def widen(self, text):
        return self.instruction(f"zext i1 {text} to i64")

    def truth(self, text):
        return self.instruction(f"icmp ne i64 {text}, 0")

    def choose(self, cond, then, otherwise, dtype, lazy):
        type_ = LTYPE[dtype.name]
        if lazy:
            return self.branch(cond, then, otherwise, type_)
        a, b = then(), otherwise()
        return self.instruction(f"select i1 {cond}, {type_} {a}, {type_} {b}")

    def short_circuit(self, op, a, rest):
        if op == "&&":
            return self.branch(a, rest, lambda: "false", "i1")
        return self.branch(a, lambda: "true", rest, "i1")

    def implies(self, valid, cond):
        return self.branch(valid, cond, lambda: "true", "i1")

    def guarded(self, cond, inner, fill, check, dtype):
        if check:
            self.when(cond, lambda: None, check, "ok")
        type_ = LTYPE[dtype.name]
        return self.instruction(f"select i1 {cond}, {type_} {inner}, {type_} {fill}")

    literal = staticmethod(constant)

    def index_value(self, index, dtype):
        """Truncated, to bool too (its type is uint8's)."""
        return self.convert(index, dtypes.int64, dtypes.uint8 if dtype == dtypes.bool_ else dtype)

    # ---- statements --------------------------------------------------------------------------
    def update(self, target, index, op, v):
        """A parameter's or an accumulator's element op= v, where v is of the dtype the memory's is
        computed in (float16 and bfloat16 memory: float32 math, rounded back per update)."""
        address, dtype = self.address(target, index)
        wide, type_ = dtypes.computed_in(dtype), LTYPE[dtype.name]
        old = self.convert(self.instruction(f"load {type_}, ptr {address}"), dtype, wide)
        new = self.form(op_form(COMBINE, op, wide), old, v, **self.fields(wide, wide))
        self.emit(f"store {type_} {self.convert(new, wide, dtype)}, ptr {address}")

    def define(self, s):
        t, pointer = LTYPE[s.dtype.name], self.fresh(s.name)
        self.slots[s.name] = pointer
        if s.size is None:
            self.allocas.append(f"{pointer} = alloca {t}, align 8")
            self.emit(f"store {t} {constant(s.init, s.dtype)}, ptr {pointer}")
            return
        self.allocas.append(f"{pointer} = alloca [{s.size} x {t}], align 64")
        if s.init is not None:          # each element assigned its initial value
            element = Var(("init", s.name))
            fill = ir.Assign(s.name, element, ir.Scalar(s.init, s.dtype))
            self.loop(ir.Loop(element.axis, s.size, ir.VECTOR, [fill]), {})

    def accumulate(self, define, index, op, v, dtype):
        self.update(define.name, index, op, self.convert(v, dtype, define.dtype))

    def fused(self, define, index, a, b, cond):
        (address, _), t = self.address(define.name, index), LTYPE[define.dtype.name]
        suffix, old = FLOAT_SUFFIX[define.dtype.name], self.instruction(f"load {t}, ptr {address}")
        fma = self.instruction(f"call {t} @llvm.fma.{suffix}({t} {a}, {t} {b}, {t} {old})")
        if cond is not None:
            fma = self.instruction(f"select i1 {cond}, {t} {fma}, {t} {old}")
        self.emit(f"store {t} {fma}, ptr {address}")

    def combine_memory(self, param, index, op, v, dtype):
        self.update(param, index, op, v)

    widened_update = combine_memory      # update() widens and rounds back itself

    def when(self, cond, update, check, join="next"):
        fail = (lambda: self.emit(f"store i64 {check}, ptr %err")) if check else (lambda: None)
        self.jump(cond, update, fail, self.fresh(join))

    def loop(self, s, names, start="0", end=None):
        """A counted loop over [start, end) (a thread's share) when `end` is given, else over
        [0, extent)."""
        if s.extent <= 0:
            return
        var = self.fresh(f"i{s.var}." if isinstance(s.var, int) else "q")
        node = {"kind": "loop", "var": var, "start": start, "end": end or str(s.extent), "before": self.block,
                "head": self.fresh("loop"), "latch": self.fresh("latch"), "done": self.fresh("done"),
                "enter": end and self.instruction(f"icmp slt i64 {start}, {end}")}
        saved, self.vars[s.var] = self.vars.get(s.var), var
        node["body"] = self.apart(node["head"], lambda: self.each(s.body))[0]
        node["more"] = self.fresh()
        self.lines.append(node)
        self.vars[s.var], self.block = saved, node["done"]

    def each(self, statements):
        for s in statements:
            self.statement(s)

    def groups(self):
        """Top-level statements as body functions: each outer loop worth threads on its own."""
        groups = []
        for loop, statements in thread_groups(self.kernel.body):
            self.lines, self.allocas, self.block = [], [], "%entry"
            if loop is None:
                self.each(statements)
            else:
                self.loop(loop, {}, "%start", "%end")
            groups.append({"extent": loop and loop.extent, "lines": self.lines, "allocas": self.allocas})
        return groups


def render(kernels, openmp=True):
    """LLVM IR for a batch of kernels (openmp: outer loops run in an OpenMP team)."""
    views = [{"name": kernel.name, "groups": Renderer(kernel).groups(),
              "params": [{"output": p.output, "shared": p.shared} for p in kernel.params]}
             for kernel in kernels]
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], openmp=openmp,
                            threads=flags.NUM_THREADS)


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
        try:
            import llvmlite.binding as llvm
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
        except (ImportError, OSError, RuntimeError) as error:
            raise CompileError(f"llvmlite is unusable: {error}") from None
        self.llvm, self.ffi, self.engines = llvm, cffi.FFI(), {}    # engines: object file -> its MCJIT
        self.openmp = self._load_library("gomp")
        # float16 conversions LLVM leaves to the compiler runtime (float64 -> half, which its
        # optimiser also forms from float32 math rounded to half): unresolved, they were calls to 0
        self._load_library("gcc_s")
        self.machine = self._target_machine()
        identity = "\n".join(["llvm", str(llvm.llvm_version_info), self.machine.triple,
                              llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), "O3"])
        super().__init__(KernelCache(flags.CACHE_DIR, identity, ".ll", ".o"))

    def _target_machine(self):
        llvm = self.llvm
        return llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
            reloc="pic", codemodel="default")

    def _load_library(self, name):
        """Make a system library's symbols visible to the JIT; whether it could be loaded.

        LLVM closes its "permanent" libraries when the process exits, which would unmap the
        OpenMP runtime while its idle worker threads still spin in it (SIGSEGV after the work is
        done); a second handle opened with RTLD_NODELETE keeps it mapped to the end."""
        path = ctypes.util.find_library(name)
        if path is None:
            return False
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NODELETE)
            self.llvm.load_library_permanently(path)
        except (OSError, RuntimeError):
            return False
        return True

    def render(self, kernels):
        return render(kernels, self.openmp)

    def compile(self, source_path, binary_path):
        llvm = self.llvm
        with open(source_path) as stream:
            source = stream.read()
        try:
            module = llvm.parse_assembly(source)
            module.verify()
        except RuntimeError as error:
            raise CompileError(f"LLVM rejected {source_path}: {error}") from None
        module.triple, module.data_layout = self.machine.triple, str(self.machine.target_data)
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization, options.slp_vectorization = True, True
        builder = llvm.create_pass_builder(self.machine, options)
        builder.getModulePassManager().run(module, builder)
        with open(binary_path, "wb") as stream:
            stream.write(self.machine.emit_object(module))

    def open(self, path, name):
        """The kernel `name` of object file `path`. Each object file gets an engine of its own (an
        engine takes its target machine): one engine holding every object of a long test run
        aborted in finalize_object after some thousands of them."""
        if path not in self.engines:
            engine = self.llvm.create_mcjit_compiler(self.llvm.parse_assembly(""), self._target_machine())
            with open(path, "rb") as stream:
                engine.add_object_file(self.llvm.ObjectFileRef.from_data(stream.read()))
            engine.finalize_object()
            self.engines[path] = engine
        address = self.engines[path].get_function_address(name)
        if not address:
            raise AttributeError(f"kernel {name} is missing from {path}")
        return launcher(self.ffi, self.ffi.cast("void (*)(char **, int64_t *)", address))
