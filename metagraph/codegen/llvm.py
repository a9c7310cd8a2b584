"""The `llvm` backend: kernel IR rendered to LLVM IR text, optimised and compiled by llvmlite (O3,
loop and SLP vectorisers, the host CPU's features), object code cached on disk and loaded into an
in-process MCJIT.

Parallel outer loops: each kernel's outer parallel loop is a body function over [start, end);
the kernel calls it through the OpenMP runtime (GOMP_parallel, libgomp loaded into the process),
one contiguous block of iterations per thread. The OpenMP runtime was chosen over Python threads
because a launch then costs microseconds and the team is the same one the C backend's kernels use.
Without libgomp the body function runs the whole range on the calling thread.

The template (`templates/llvm.j2`) holds the module's structure: helpers, entry points, the
OpenMP trampolines. `llvm_ops.py` holds each op's instructions; the walk over the IR is
codegen/walker.py's, and `Renderer` spells it as instructions.
"""
import ctypes
import ctypes.util
import os
import re

import cffi

from metagraph import dtypes, flags
from metagraph.codegen.compiled import CompileError, CompiledBackend, launcher, template, thread_groups
from metagraph.codegen.llvm_ops import COMBINE, FLOAT_SUFFIX, INDEX, LTYPE, OPS, Ops, constant
from metagraph.codegen.walker import Walker, op_form
from metagraph.compiler import ir
from metagraph.runtime.cache import KernelCache

CALL = re.compile(r"call (\S+) @(llvm\.[\w.]+)\((.*)\)$")


class Renderer(Ops, Walker):
    """The walker's constructs as LLVM instructions: each value an SSA name, each op the
    instructions of its table entry, reads that must not happen real branches."""
    OPS, INDEX = OPS, INDEX

    def __init__(self, kernel, declarations):
        super().__init__(kernel)
        self.declarations, self.counter, self.vars = declarations, 0, {}
        self.allocas, self.block, self.slots = [], "%entry", {}

    # ---- plumbing --------------------------------------------------------------------------
    def fresh(self, stem="t"):
        self.counter += 1
        return f"%{stem}{self.counter}"

    def emit(self, text):
        self.lines.append("  " + text)

    def instruction(self, text, stem="t"):
        name = self.fresh(stem)
        self.emit(f"{name} = {text}")
        call = CALL.match(text)
        if call:        # an intrinsic: declared once per module
            types = ", ".join(arg.split()[0] for arg in call[3].split(", "))
            self.declarations[call[2]] = f"declare {call[1]} @{call[2]}({types})"
        return name

    def form(self, template, *operands, **fields):
        """A table entry's instructions; the name of the last one's result."""
        results = {}
        for part in template.split("; "):
            results[f"r{len(results)}"] = self.instruction(part.format(*operands, **fields, **results))
        return results[f"r{len(results) - 1}"]

    def label(self, name):
        self.lines.append(f"{name[1:]}:")
        self.block = name

    def jump(self, cond, then, otherwise, join):
        """Branch on cond to then() or otherwise() (each emitting its side), both on to `join`;
        their results and the blocks they end in."""
        yes, no = self.fresh("then"), self.fresh("else")
        self.emit(f"br i1 {cond}, label {yes}, label {no}")
        ends = []
        for label, side in ((yes, then), (no, otherwise)):
            self.label(label)
            ends.append((side(), self.block))
            self.emit(f"br label {join}")
        self.label(join)
        return ends

    def branch(self, cond, then, otherwise, type_):
        """`then()` where cond holds, else `otherwise()`: each computed only on its own side."""
        (a, a_end), (b, b_end) = self.jump(cond, then, otherwise, self.fresh("join"))
        return self.instruction(f"phi {type_} [ {a}, {a_end} ], [ {b}, {b_end} ]")

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
            self.jump(cond, lambda: None, lambda: self.emit(f"store i64 {check}, ptr %err"), self.fresh("ok"))
        type_ = LTYPE[dtype.name]
        return self.instruction(f"select i1 {cond}, {type_} {inner}, {type_} {fill}")

    literal = staticmethod(constant)

    def address(self, param, index):
        """The address of element `index` (an i64 operand) of kernel parameter `param`."""
        type_ = LTYPE[self.params[param].dtype.name]
        return self.instruction(f"getelementptr inbounds {type_}, ptr %p{param}, i64 {index}", "a")

    def element(self, param, index):
        type_ = LTYPE[self.params[param].dtype.name]
        return self.instruction(f"load {type_}, ptr {self.address(param, index)}")

    def slot(self, name, index):
        """The address of an accumulator (of its element `index` when it is an array)."""
        pointer, type_ = self.slots[name], LTYPE[self.accumulators[name].dtype.name]
        if index is None:
            return pointer
        return self.instruction(f"getelementptr inbounds {type_}, ptr {pointer}, i64 {index}", "a")

    def read_accumulator(self, name, index):
        type_ = LTYPE[self.accumulators[name].dtype.name]
        return self.instruction(f"load {type_}, ptr {self.slot(name, index)}")

    def index_value(self, index, dtype):
        return self.convert(index, dtypes.int64, dtype, truncate_bool=True)

    # ---- statements --------------------------------------------------------------------------
    def update(self, address, op, v, dtype):
        """memory[address] op= v, where memory holds `dtype` and v is of the dtype `dtype` is computed
        in (float16 and bfloat16 memory: float32 math, rounded back per update)."""
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
        element = ("init", s.name)
        if s.init is not None:
            self.loop(ir.Loop(element, s.size, ir.VECTOR, []), {}, body=lambda: self.emit(
                f"store {t} {constant(s.init, s.dtype)}, ptr {self.slot(s.name, self.vars[element])}"))

    def accumulate(self, define, index, op, v, dtype):
        self.update(self.slot(define.name, index), op, self.convert(v, dtype, define.dtype), define.dtype)

    def fused(self, define, index, a, b, cond):
        t, address = LTYPE[define.dtype.name], self.slot(define.name, index)
        suffix, old = FLOAT_SUFFIX[define.dtype.name], self.instruction(f"load {t}, ptr {address}")
        fma = self.instruction(f"call {t} @llvm.fma.{suffix}({t} {a}, {t} {b}, {t} {old})")
        if cond is not None:
            fma = self.instruction(f"select i1 {cond}, {t} {fma}, {t} {old}")
        self.emit(f"store {t} {fma}, ptr {address}")

    def write_accumulator(self, name, index, v):
        self.emit(f"store {LTYPE[self.accumulators[name].dtype.name]} {v}, ptr {self.slot(name, index)}")

    def write(self, param, index, v):
        self.emit(f"store {LTYPE[self.params[param].dtype.name]} {v}, ptr {self.address(param, index)}")

    def combine_memory(self, param, index, op, v, dtype):
        self.update(self.address(param, index), op, v, self.params[param].dtype)

    widened_update = combine_memory      # update() widens and rounds back itself

    def when(self, cond, update, check):
        fail = (lambda: self.emit(f"store i64 {check}, ptr %err")) if check else (lambda: None)
        self.jump(cond, update, fail, self.fresh("next"))

    def loop(self, s, names, start="0", end=None, body=None):
        """A counted loop; [start, end) when given (a thread's share), else [0, extent)."""
        if s.extent <= 0:
            return
        var = self.fresh(f"i{s.var}." if isinstance(s.var, int) else "q")
        head, latch, done = self.fresh("loop"), self.fresh("latch"), self.fresh("done")
        before = self.block
        if end is None:
            end = str(s.extent)
            self.emit(f"br label {head}")
        else:
            self.emit(f"br i1 {self.instruction(f'icmp slt i64 {start}, {end}')}, label {head}, label {done}")
        self.label(head)
        self.emit(f"{var} = phi i64 [ {start}, {before} ], [ {var}.next, {latch} ]")
        saved = self.vars.get(s.var)
        self.vars[s.var] = var
        if body is not None:
            body()
        for statement in s.body:
            self.statement(statement)
        self.emit(f"br label {latch}")
        self.label(latch)
        self.emit(f"{var}.next = add nuw nsw i64 {var}, 1")
        more = self.instruction(f"icmp slt i64 {var}.next, {end}")
        self.emit(f"br i1 {more}, label {head}, label {done}")
        self.label(done)
        self.vars[s.var] = saved

    def groups(self):
        """Top-level statements as body functions: each outer loop worth threads on its own."""
        groups = []
        for loop, statements in thread_groups(self.kernel.body):
            self.lines, self.allocas, self.block = [], [], "%entry"
            if loop is None:
                for s in statements:
                    self.statement(s)
            else:
                self.loop(loop, {}, "%start", "%end")
            groups.append({"extent": loop and loop.extent, "lines": self.lines, "allocas": self.allocas})
        return groups


_TEMPLATE = template("llvm.j2")


def render(kernels, openmp=True):
    """LLVM IR for a batch of kernels (openmp: outer loops run in an OpenMP team)."""
    # the intrinsics the module declares; the template's float32 exp2 uses these two in any case
    declarations, views = {"llvm.rint.f32": "declare float @llvm.rint.f32(float)",
                           "llvm.fma.f32": "declare float @llvm.fma.f32(float, float, float)"}, []
    for kernel in kernels:
        renderer = Renderer(kernel, declarations)
        params = [{"output": p.output, "shared": p.shared} for p in kernel.params]
        views.append({"name": kernel.name, "params": params,
                      "groups": renderer.groups()})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], openmp=openmp,
                            threads=flags.NUM_THREADS, declarations=sorted(declarations.values()))


def _llvm():
    """llvmlite's binding with the native target initialised (an ImportError names the problem)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm


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
            llvm = _llvm()
        except (ImportError, OSError, RuntimeError) as error:
            raise CompileError(f"llvmlite is unusable: {error}") from None
        self.llvm = llvm
        self.openmp = self._load_library("gomp")
        # float16 conversions LLVM leaves to the compiler runtime (float64 -> half, which its
        # optimiser also forms from float32 math rounded to half): unresolved, they were calls to 0
        self._load_library("gcc_s")
        self.machine = self._target_machine()
        identity = "\n".join(["llvm", str(llvm.llvm_version_info), self.machine.triple,
                              llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), "O3"])
        super().__init__(KernelCache(flags.CACHE_DIR, identity, ".ll", ".o"))
        self.ffi = cffi.FFI()
        self.engines = {}        # object file -> the MCJIT engine that loaded it

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
