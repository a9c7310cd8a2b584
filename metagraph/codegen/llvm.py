"""The `llvm` backend: kernel IR rendered to LLVM IR text, optimised and compiled by llvmlite (O3,
loop and SLP vectorisers, the host CPU's features), object code cached on disk and loaded into an
in-process MCJIT.

Parallel outer loops: each kernel's outer parallel loop is a body function over [start, end);
the kernel calls it through the OpenMP runtime (GOMP_parallel, libgomp loaded into the process),
one contiguous block of iterations per thread. The OpenMP runtime was chosen over Python threads
because a launch then costs microseconds and the team is the same one the C backend's kernels use.
Without libgomp the body function runs the whole range on the calling thread.

The template (`templates/llvm.j2`) holds the module's structure: helpers, entry points, the
OpenMP trampolines. `llvm_ops.py` holds each op's instructions; `Renderer` walks the IR.
"""
import ctypes
import ctypes.util
import os

import cffi

from metagraph import dtypes, flags
from metagraph.codegen.compiled import (CompileError, CompiledBackend, fused_product, launcher, template,
                                        thread_groups)
from metagraph.codegen.llvm_ops import FLOAT_SUFFIX, LTYPE, Ops, constant
from metagraph.compiler import ir
from metagraph.compiler.simplify import value_range
from metagraph.expr import Binary, Const, Extra, Select, Var
from metagraph.runtime.cache import KernelCache

INDEX_COMPARE = {"<": "slt", "<=": "sle", "==": "eq", "!=": "ne"}
INDEX_ARITH = {"+": "add", "-": "sub", "*": "mul"}


def _pure(expr):
    """Whether evaluating an index expression where it is not needed is harmless: no reads of
    index tensors (they may be out of bounds there) and no division that can report an error."""
    if isinstance(expr, Extra):
        return False
    if isinstance(expr, Binary):
        if expr.op in ("//", "%") and not isinstance(expr.b, Const):
            return False
        return _pure(expr.a) and _pure(expr.b)
    if isinstance(expr, Select):
        return _pure(expr.cond) and _pure(expr.a) and _pure(expr.b)
    return True


class Renderer(Ops):
    """Renders one kernel's IR to the instruction lines of its body functions."""

    def __init__(self, kernel, module):
        self.kernel, self.extents, self.module = kernel, kernel.extents, module
        self.counter = 0
        self.vars, self.accumulators = {}, {}
        self.lines, self.allocas, self.block = [], [], "%entry"

    # ---- plumbing --------------------------------------------------------------------------
    def fresh(self, stem="t"):
        self.counter += 1
        return f"%{stem}{self.counter}"

    def emit(self, text):
        self.lines.append("  " + text)

    def instruction(self, text, stem="t"):
        name = self.fresh(stem)
        self.emit(f"{name} = {text}")
        return name

    def label(self, name):
        self.lines.append(f"{name[1:]}:")
        self.block = name

    def branch(self, cond, then, otherwise, type_):
        """`then()` where cond holds, else `otherwise()`: each computed only on its own side."""
        yes, no, join = self.fresh("then"), self.fresh("else"), self.fresh("join")
        self.emit(f"br i1 {cond}, label {yes}, label {no}")
        self.label(yes)
        a, a_end = then(), self.block
        self.emit(f"br label {join}")
        self.label(no)
        b, b_end = otherwise(), self.block
        self.emit(f"br label {join}")
        self.label(join)
        return self.instruction(f"phi {type_} [ {a}, {a_end} ], [ {b}, {b_end} ]")

    def call(self, type_, function, args):
        self.module.declare(type_, function, args)
        return self.instruction(f"call {type_} @{function}({', '.join(args)})")

    # ---- index expressions: int64 arithmetic, i1 conditions -------------------------------------
    def index(self, expr):
        """(operand, type) of an index expression; type is i64 or i1."""
        if isinstance(expr, Var):
            return self.vars[expr.axis], "i64"
        if isinstance(expr, Const):
            return str(expr.value), "i64"
        if isinstance(expr, Select):
            cond = self.as_bool(expr.cond)
            if _pure(expr.a) and _pure(expr.b):
                a, b = self.as_int(expr.a), self.as_int(expr.b)
                return self.instruction(f"select i1 {cond}, i64 {a}, i64 {b}"), "i64"
            return self.branch(cond, lambda: self.as_int(expr.a), lambda: self.as_int(expr.b), "i64"), "i64"
        if isinstance(expr, Extra):
            param = self.kernel.params[expr.index]
            value = self.load(expr.index, param.dtype, self.as_int(ir.extra_offset(param, expr.args)))
            return self.convert(value, param.dtype, dtypes.int64), "i64"
        op = expr.op
        if op in ("&&", "||"):
            a = self.as_bool(expr.a)
            if _pure(expr.b):
                b = self.as_bool(expr.b)
                return self.instruction(f"{'and' if op == '&&' else 'or'} i1 {a}, {b}"), "i1"
            rest = lambda: self.as_bool(expr.b)        # noqa: E731 (short-circuit: b only when needed)
            if op == "&&":
                return self.branch(a, rest, lambda: "false", "i1"), "i1"
            return self.branch(a, lambda: "true", rest, "i1"), "i1"
        a, b = self.as_int(expr.a), self.as_int(expr.b)
        if op in INDEX_ARITH:
            return self.instruction(f"{INDEX_ARITH[op]} i64 {a}, {b}"), "i64"
        if op in INDEX_COMPARE:
            return self.instruction(f"icmp {INDEX_COMPARE[op]} i64 {a}, {b}"), "i1"
        if op in ("min", "max"):
            less = self.instruction(f"icmp {'slt' if op == 'min' else 'sgt'} i64 {a}, {b}")
            return self.instruction(f"select i1 {less}, i64 {a}, i64 {b}"), "i64"
        if isinstance(expr.b, Const) and expr.b.value > 0 and value_range(expr.a, self.extents)[0] >= 0:
            return self.instruction(f"{'sdiv' if op == '//' else 'srem'} i64 {a}, {b}"), "i64"
        low, high = value_range(expr.b, self.extents)
        if low > 0 or high < 0:
            return self.call("i64", "mg_floordiv" if op == "//" else "mg_floormod",
                             [f"i64 {a}", f"i64 {b}"]), "i64"
        return self.call("i64", "mg_index_div" if op == "//" else "mg_index_mod",
                         [f"i64 {a}", f"i64 {b}", "ptr %err"]), "i64"

    def as_int(self, expr):
        value, type_ = self.index(expr)
        return self.instruction(f"zext i1 {value} to i64") if type_ == "i1" else value

    def as_bool(self, expr):
        value, type_ = self.index(expr)
        return self.instruction(f"icmp ne i64 {value}, 0") if type_ == "i64" else value

    # ---- values ------------------------------------------------------------------------------
    def address(self, param, dtype, offset):
        """The address of element `offset` (an i64 operand) of kernel parameter `param`."""
        type_ = LTYPE[dtype.name]
        return self.instruction(f"getelementptr inbounds {type_}, ptr %p{param}, i64 {offset}", "a")

    def load(self, param, dtype, offset):
        return self.instruction(f"load {LTYPE[dtype.name]}, ptr {self.address(param, dtype, offset)}")

    def value(self, value, names):
        """The operand holding a value; each distinct value is computed once per statement."""
        if id(value) in names:
            return names[id(value)]
        if isinstance(value, ir.Scalar):
            return constant(value.value, value.dtype)
        if isinstance(value, ir.Ref):
            address = self.slot(value.name, value.index)
            result = self.instruction(f"load {LTYPE[value.dtype.name]}, ptr {address}")
        elif isinstance(value, ir.IndexValue):
            result = self.convert(self.as_int(value.expr), dtypes.int64, value.dtype, truncate_bool=True)
        elif isinstance(value, ir.Load):
            stored = self.kernel.params[value.param].dtype      # float16 or bfloat16 read as float32

            def read():
                loaded = self.load(value.param, stored, self.as_int(value.index))
                return self.convert(loaded, stored, value.dtype)
            if value.valid is None:
                result = read()
            else:
                result = self.branch(self.as_bool(value.valid), read, lambda: constant(0, value.dtype),
                                     LTYPE[value.dtype.name])
        elif isinstance(value, ir.Guard):
            inner = self.value(value.value, names)
            if value.valid is None:
                cond = self.as_bool(value.cond)
            else:   # where valid is false the value is unused and cond may read out of bounds
                cond = self.branch(self.as_bool(value.valid), lambda: self.as_bool(value.cond),
                                   lambda: "true", "i1")
            if value.check:
                failed, after = self.fresh("fail"), self.fresh("ok")
                self.emit(f"br i1 {cond}, label {after}, label {failed}")
                self.label(failed)
                self.emit(f"store i64 {value.check}, ptr %err")
                self.emit(f"br label {after}")
                self.label(after)
            type_ = LTYPE[value.dtype.name]
            result = self.instruction(f"select i1 {cond}, {type_} {inner}, {type_} "
                                      f"{constant(value.fill, value.dtype)}")
        else:
            args = [self.value(arg, names) for arg in value.args]
            result = self.apply(value, args)
        names[id(value)] = result
        return result

    # ---- statements --------------------------------------------------------------------------
    def slot(self, name, index):
        """The address of an accumulator (of its element `index` when it is an array)."""
        define, pointer = self.accumulators[name]
        if index is None:
            return pointer
        return self.instruction(f"getelementptr inbounds {LTYPE[define.dtype.name]}, ptr {pointer}, "
                                f"i64 {self.as_int(index)}", "a")

    def update(self, address, op, v, dtype):
        """memory[address] op= v, where memory holds `dtype` and v is of the dtype `dtype` is computed
        in (float16 and bfloat16 memory: float32 math, rounded back per update)."""
        wide = dtypes.computed_in(dtype)
        old = self.convert(self.instruction(f"load {LTYPE[dtype.name]}, ptr {address}"), dtype, wide)
        new = self.convert(self.combine(old, op, v, wide), wide, dtype)
        self.emit(f"store {LTYPE[dtype.name]} {new}, ptr {address}")

    def statement(self, s, start="0", end=None):
        names = {}
        if isinstance(s, ir.Loop):
            self.loop(s, start, end)
        elif isinstance(s, ir.Define):
            t = LTYPE[s.dtype.name]
            pointer = self.fresh(s.name)
            self.accumulators[s.name] = (s, pointer)
            if s.size is None:
                self.allocas.append(f"{pointer} = alloca {t}, align 8")
                self.emit(f"store {t} {constant(s.init, s.dtype)}, ptr {pointer}")
            else:
                self.allocas.append(f"{pointer} = alloca [{s.size} x {t}], align 64")
                element = ("init", s.name)
                if s.init is not None:
                    self.loop(ir.Loop(element, s.size, ir.VECTOR, []), body=lambda: self.emit(
                        f"store {t} {constant(s.init, s.dtype)}, ptr {self.slot(s.name, Var(element))}"))
        elif isinstance(s, ir.Accumulate):
            define = self.accumulators[s.name][0]
            product = fused_product(s, define.dtype)
            if product is not None:
                t = LTYPE[define.dtype.name]
                a, b = (self.value(arg, names) for arg in product[:2])
                address = self.slot(s.name, s.index)
                old = self.instruction(f"load {t}, ptr {address}")
                fma = self.call(t, f"llvm.fma.{FLOAT_SUFFIX[define.dtype.name]}",
                                [f"{t} {a}", f"{t} {b}", f"{t} {old}"])
                if product[2] is not None:
                    fma = self.instruction(f"select i1 {self.as_bool(product[2])}, {t} {fma}, {t} {old}")
                self.emit(f"store {t} {fma}, ptr {address}")
            else:
                v = self.convert(self.value(s.value, names), s.value.dtype, define.dtype)
                self.update(self.slot(s.name, s.index), s.op, v, define.dtype)
        elif isinstance(s, ir.Assign):
            define = self.accumulators[s.name][0]
            v = self.value(s.value, names)
            self.emit(f"store {LTYPE[define.dtype.name]} {v}, ptr {self.slot(s.name, s.index)}")
        elif isinstance(s, ir.Store):
            param = self.kernel.params[s.param]
            v = self.value(s.value, names)
            address = self.address(s.param, param.dtype, self.as_int(s.index))
            self.emit(f"store {LTYPE[param.dtype.name]} {v}, ptr {address}")
        elif isinstance(s, ir.ScatterAccumulate):
            param = self.kernel.params[s.param]
            v = self.convert(self.value(s.value, names), s.value.dtype, dtypes.computed_in(param.dtype))

            def scatter():
                self.update(self.address(s.param, param.dtype, self.as_int(s.index)), s.op, v, param.dtype)
            if s.valid is None:
                scatter()
            else:
                inside, outside, after = self.fresh("in"), self.fresh("out"), self.fresh("next")
                self.emit(f"br i1 {self.as_bool(s.valid)}, label {inside}, label {outside}")
                self.label(inside)
                scatter()
                self.emit(f"br label {after}")
                self.label(outside)
                if s.check:
                    self.emit(f"store i64 {s.check}, ptr %err")
                self.emit(f"br label {after}")
                self.label(after)

    def loop(self, s, start="0", end=None, body=None):
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
        return [self.group([loop], loop.extent) if loop else self.group(statements, None)
                for loop, statements in thread_groups(self.kernel.body)]

    def group(self, statements, extent):
        self.lines, self.allocas, self.block = [], [], "%entry"
        for s in statements:
            if extent is None:
                self.statement(s)
            else:
                self.statement(s, "%start", "%end")
        return {"extent": extent, "lines": self.lines, "allocas": self.allocas}


class Module:
    """What the kernels of one module share: the intrinsics they declare."""

    def __init__(self):
        # the template's float32 exp2 helper uses these two whether a kernel does or not
        self.declarations = {"llvm.rint.f32": "declare float @llvm.rint.f32(float)",
                             "llvm.fma.f32": "declare float @llvm.fma.f32(float, float, float)"}

    def declare(self, type_, function, args):
        if function.startswith("llvm."):
            types = ", ".join(arg.split()[0] for arg in args)
            self.declarations[function] = f"declare {type_} @{function}({types})"


_TEMPLATE = template("llvm.j2")


def render(kernels, openmp=True):
    """LLVM IR for a batch of kernels (openmp: outer loops run in an OpenMP team)."""
    module, views = Module(), []
    for kernel in kernels:
        renderer = Renderer(kernel, module)
        params = [{"output": p.output, "shared": p.shared} for p in kernel.params]
        views.append({"name": kernel.name, "params": params,
                      "groups": renderer.groups()})
    return _TEMPLATE.render(kernels=views, names=[k.name for k in kernels], openmp=openmp,
                            threads=flags.NUM_THREADS, declarations=sorted(module.declarations.values()))


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
