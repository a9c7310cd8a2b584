"""The shared IR walker (codegen/walker.py): its decisions, and that a backend is only its spelling.

`PythonBackend` below is a whole port in the shape docs/porting.md gives: an op table, the walker's
hooks spelt as Python source, and compile/open. It runs the same kernels as the shipped backends
and must agree with the numpy oracle."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import dtypes, flags
from metagraph.codegen import bang, c, llvm, opencl
from metagraph.codegen.compiled import CompiledBackend
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.codegen.walker import Walker, division, op_form, pure
from metagraph.compiler import ir
from metagraph.expr import Const, Extra, Var, binary
from metagraph.pipeline.realize import Pipeline
from metagraph.runtime.cache import KernelCache
from tests.helpers import needs

# ---- the walker's decisions ------------------------------------------------------------------


def test_an_index_division_takes_the_cheapest_form_its_operands_allow():
    extents = {0: 10, 1: 4}
    assert division(Var(0) // 4, extents) == "exact"             # never negative, positive constant
    assert division((Var(0) - 5) // 4, extents) == "floor"       # may be negative
    assert division(Var(0) // (Var(1) + 1), extents) == "floor"  # a divisor that is never zero
    assert division(Var(0) % Var(1), extents) == "checked"       # a divisor that may be zero


def test_an_index_expression_that_reads_or_may_fail_is_not_pure():
    assert pure(Var(0) * 3 + 1) and pure(Var(0) // 2)
    assert not pure(Extra(0, (Var(0),))) and not pure(Var(0) // Var(1))
    assert not pure(binary("&&", Var(0), Extra(1, (Var(0),))))


def test_an_op_form_is_chosen_by_dtype_then_kind_then_op():
    table = {"add": "generic", ("add", "float"): "float", ("add", "float32"): "float32"}
    assert op_form(table, "add", dtypes.float32) == "float32"
    assert op_form(table, "add", dtypes.float64) == "float"
    assert op_form(table, "add", dtypes.int8) == "generic"


def test_every_code_generator_spells_the_shared_walk():
    for module in (c, llvm, bang, opencl):
        assert issubclass(module.Renderer, Walker), module.__name__


def test_llvm_declares_each_intrinsic_its_table_calls_once():
    x = mg.rand(16)
    source = _render_with(llvm.render, (x.sqrt() + x.sqrt() * 2).exp())
    assert source.count("declare float @llvm.sqrt.f32(float)") == 1


def test_an_index_read_behind_a_condition_is_a_branch_in_ssa_and_short_circuit_in_c():
    guarded_read = binary("&&", binary("<", Var(0), Const(3)), binary("<", Extra(1, (Var(0),)), Const(2)))
    params = [ir.Param("p0", dtypes.int64, (4,), True), ir.Param("p1", dtypes.int64, (4,), False)]
    kernel = ir.Kernel("k", params, [ir.Loop(0, 4, ir.PARALLEL, [
        ir.Store(0, Var(0), ir.IndexValue(guarded_read, dtypes.int64))])], {0: 4})
    assert "phi i1" in llvm.render([kernel])             # the read only where i0 < 3 holds
    assert "((i0 < 3) && (p1[(0 + (i0 * 1))] < 2))" in c.render([kernel])


def test_a_test_of_indices_alone_evaluates_both_sides_in_c_without_a_branch():
    inside = binary("&&", binary("<=", Const(1), Var(0)), binary("<", Var(0), Const(3)))
    params = [ir.Param("p0", dtypes.int64, (4,), True)]
    kernel = ir.Kernel("k", params, [ir.Loop(0, 4, ir.PARALLEL, [
        ir.Store(0, Var(0), ir.IndexValue(inside, dtypes.int64))])], {0: 4})
    assert "((1 <= i0) & (i0 < 3))" in c.render([kernel])


@pytest.mark.parametrize("exprs", [["i0", "i1 if (i0 and i1) else 0"], ["i0", "i0 or i1"],
                                   ["i0", "i1 if ((i1 % 3) and (i0 % 2)) else 9"]])
@pytest.mark.parametrize("backend", ["c", "llvm", "opencl", "bang"])
def test_a_logical_test_of_integers_is_not_a_bitwise_one(backend, exprs):
    """`2 and 1` is true: only two truth values may be combined bit by bit."""
    needs(backend)
    x = np.arange(40, dtype=np.float32).reshape(4, 10)
    values = []
    for name in ("numpy", backend):
        mg.set_backend(name)
        values.append(mg.reindex(mg.tensor(x), (4, 10), exprs, overflow_value=-1.0).numpy())
    np.testing.assert_array_equal(values[0], values[1])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32])
def test_a_max_into_an_array_element_is_a_select_not_a_conditional_store(dtype):
    """GCC 12 vectorises the one, not the other (a register tile's row of maxima)."""
    params = [ir.Param("p0", dtype, (8,), True), ir.Param("p1", dtype, (8, 4), False)]
    update = ir.Accumulate("acc", "max", ir.Load(1, Var(0) * 4 + Var(1), dtype), Var(0))
    kernel = ir.Kernel("k", params, [ir.Define("acc", dtype, -100, "max", 8), ir.Loop(1, 4, ir.REDUCE, [
        ir.Loop(0, 8, ir.VECTOR, [update])]), ir.Loop(0, 8, ir.VECTOR, [
            ir.Store(0, Var(0), ir.Ref("acc", dtype, Var(0)))])], {0: 8, 1: 4})
    source = c.render([kernel])
    assert "acc[i0] = " in source and "if (" not in source[source.index("void k("):]


def _render_with(render, *tensors):
    from metagraph.compiler.graph import pending_graph
    from metagraph.compiler.lower import schedule
    return render([step.kernel for step in schedule(pending_graph([t.node for t in tensors]))])


# ---- a port in the porting guide's shape: Python source ----------------------------------------

NP = {"bool": "np.uint8", **{name: f"np.{name}" for name in ("uint8", "int8", "int16", "int32", "int64",
                                                              "float32", "float64")}}


class PythonSource(Walker):
    """Kernels as Python functions over flat numpy arrays: the walker's hooks, spelt as Python."""
    OPS = {"add": "({0} + {1})", "mul": "({0} * {1})", "neg": "(-{0})", "recip": "({one} / {0})",
           "sqrt": "np.sqrt({0})", "exp2": "np.exp2({0})", "log2": "np.log2({0})", "sin": "np.sin({0})",
           "cos": "np.cos({0})", "pow": "np.power({0}, {1})", "cmplt": "np.uint8({0} < {1})",
           "cmpne": "np.uint8({0} != {1})", "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
           "where": "(({1}) if {0} else ({2}))", "max": "(({0}) if {0} > {1} else ({1}))",
           ("max", "float"): "(({0}) if ({0} != {0} or {0} > {1}) else ({1}))",
           "idiv": "divide({0}, {1}, err, {site}, False)", "mod": "divide({0}, {1}, err, {site}, True)",
           "fma": "({2} + {0} * {1})"}
    INDEX = {op: f"({{0}} {op} {{1}})" for op in ("+", "-", "*", "<", "<=", "==", "!=")}
    INDEX.update({"&&": "({0} and {1})", "||": "({0} or {1})", "min": "min({0}, {1})", "max": "max({0}, {1})",
                  **{(op, form): f"({{0}} {op} {{1}})" for op in ("//", "%") for form in ("exact", "floor")},
                  ("//", "checked"): "divide({0}, {1}, err, -1, False)",
                  ("%", "checked"): "divide({0}, {1}, err, -1, True)"})
    COMBINE = {"add": "{0} + {1}", "mul": "{0} * {1}", "max": "({1} if {1} > {0} else {0})",
               ("max", "float"): "({1} if ({1} != {1} or {1} > {0}) else {0})"}

    def __init__(self, kernel):
        super().__init__(kernel)
        self.depth, self.count = 1, 0

    def emit(self, line):
        self.lines.append("    " * self.depth + line)

    def bind(self, text, value):
        if isinstance(value, ir.Ref):
            return text
        self.count += 1
        self.emit(f"t{self.count} = {text}")
        return f"t{self.count}"

    def fields(self, source, dtype):
        return {"one": self.literal(1, dtype)}

    def literal(self, value, dtype):
        return f"{NP[dtype.name]}({f'float({str(float(value))!r})' if dtype.is_float else int(value)})"

    def loop_variable(self, axis):
        return f"i{axis}"

    def choose(self, cond, then, otherwise, dtype, lazy):
        return f"(({then()}) if {cond} else ({otherwise()}))"

    def implies(self, valid, cond):
        return f"(not {valid} or {cond()})"

    def guarded(self, cond, inner, fill, check, dtype):
        return f"(({inner}) if {cond} else fail(err, {check or 0}, {fill}))"

    def element(self, param, index):
        return f"p{param}[{index}]"

    def read_accumulator(self, name, index):
        return name if index is None else f"{name}[{index}]"

    def cast(self, x, source, target):
        return f"convert({x}, {NP[target.name]}, {target == dtypes.bool_})"

    def loop(self, s, names):
        self.emit(f"for i{s.var} in range({s.extent}):")
        self.depth += 1
        self.emit("pass")
        for b in s.body:
            self.statement(b)
        self.depth -= 1

    def define(self, s):
        init = self.literal(s.init if s.init is not None else 0, s.dtype)
        self.emit(f"{s.name} = {init}" if s.size is None else f"{s.name} = np.full({s.size}, {init})")

    def accumulate(self, define, index, op, v, dtype):
        target = self.read_accumulator(define.name, index)
        self.emit(f"{target} = {op_form(self.COMBINE, op, define.dtype).format(target, v)}")

    def write_accumulator(self, name, index, v):
        self.emit(f"{name}[{index}] = {v}")

    def write(self, param, index, v):
        self.emit(f"p{param}[{index}] = {v}")

    def combine_memory(self, param, index, op, v, dtype):
        target = self.element(param, index)
        self.emit(f"{target} = {op_form(self.COMBINE, op, dtype).format(target, v)}")

    def combine(self, op, a, b, dtype):
        return op_form(self.COMBINE, op, dtype).format(a, b)

    def widened_update(self, param, index, op, v, wide):
        raise mg.Unsupported("the Python port keeps no float16 or bfloat16 memory")

    def when(self, cond, update, check):
        self.emit(f"if {cond}:")
        self.depth += 1
        self.emit("pass")
        update()
        self.depth -= 1
        if check:
            self.emit(f"else:\n{'    ' * (self.depth + 1)}err[0] = {check}")


PRELUDE = '''import numpy as np
def fail(err, site, fill):
    err[0] = site
    return fill
def divide(a, b, err, site, remainder):
    if b == 0:
        err[0] = site
        return type(a)(0)
    return a % b if remainder else a // b
def convert(x, to, boolean):
    return to(x != 0) if boolean else to(x)
'''


class PythonBackend(CompiledBackend):
    """The port: render, compile (nothing to build), open (exec the function)."""
    name = "python"
    comment = "#"

    def __init__(self):
        super().__init__(KernelCache(flags.CACHE_DIR, "python-port-test", ".py", ".pyk"))

    def render(self, kernels):
        functions = []
        for kernel in kernels:
            walker = PythonSource(kernel)
            for s in kernel.body:
                walker.statement(s)
            args = ", ".join(f"p{k}" for k in range(len(kernel.params)))
            head = f"def {kernel.name}({args}{', ' if args else ''}err):\n    pass\n"
            functions.append(head + "\n".join(walker.lines))
        return PRELUDE + "\n".join(functions) + "\n"

    def compile(self, source_path, binary_path):
        with open(source_path) as source, open(binary_path, "w") as binary:
            binary.write(source.read())

    def open(self, path, name):
        namespace = {}
        with open(path) as stream:
            exec(compile(stream.read(), path, "exec"), namespace)
        if name not in namespace:
            raise AttributeError(name)
        function = namespace[name]
        return lambda arrays, err: function(*[np.asarray(a).reshape(-1) for a in arrays], err)


GRAPHS = {
    "elementwise_chain": lambda: F.relu(mg.rand(6, 5) * 1.5 - 0.5) * F.sigmoid(mg.rand(6, 5)),
    "row_max_and_sum": lambda: mg.rand(4, 37).amax(1) + mg.rand(4, 37).sum(1),
    "matmul": lambda: mg.rand(5, 7) @ mg.rand(7, 9),
    "conv_padded": lambda: F.conv2d(mg.rand(1, 2, 5, 5), mg.rand(3, 2, 3, 3), padding=1, stride=2),
    "scatter": lambda: mg.rand(5, 3).reindex_reduce("add", [3, 3], ["i0 // 2", "i1"]),
    "integer_division": lambda: mg.arange(-7, 9) // (mg.arange(16) % 5 + 1),
    "gather": lambda: mg.rand(6, 4)[mg.tensor(np.array([5, 0, 3], np.int64))],
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_port_that_only_spells_the_walk_agrees_with_the_oracle(name):
    out = GRAPHS[name]()
    want = NumpyBackend().realize([out.node])[0]
    got = Pipeline(PythonBackend()).realize([out.node])[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-5,
                               atol=1e-6)


def test_a_port_reports_a_zero_divisor_as_the_oracle_does():
    with pytest.raises(mg.MetagraphError) as found:
        Pipeline(PythonBackend()).realize([(mg.arange(4) // (mg.arange(4) - 1)).node])
    with pytest.raises(type(found.value)):
        NumpyBackend().realize([(mg.arange(4) // (mg.arange(4) - 1)).node])




@pytest.mark.parametrize("backend", ["c", "llvm", "bang", "opencl"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_scatter_into_storage_memory_is_widened_and_rounded_back_once_per_update(backend, dtype):
    """The walker's widened update (combine_memory's twin for float16 and bfloat16 memory), as each
    backend spells it: each update reads the element as float32, combines, and rounds back once (a
    max; an add is built as a float32 scatter and one rounding, ops/table.py `apply`)."""
    needs(backend)
    storage = getattr(mg, dtype).np
    values = np.linspace(-3, 5, 24).reshape(8, 3).astype(storage)
    for op, combine in (("add", np.add), ("max", np.fmax)):
        want = np.full((3, 3), -np.inf if op == "max" else 0, np.float32)
        for i0, row in enumerate(values):          # the scatter's order: its source rows in turn
            want[i0 // 3] = combine(want[i0 // 3], row.astype(np.float32))
            if op == "max":
                want = want.astype(storage).astype(np.float32)
        want = want.astype(storage)
        out = mg.tensor(values).reindex_reduce(op, [3, 3], ["i0 // 3", "i1"])
        got = mg.backend._instance(backend).realize([out.node])[0]
        np.testing.assert_array_equal(np.asarray(got, np.float32), want.astype(np.float32))
