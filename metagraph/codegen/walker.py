"""The one walk over a kernel's IR that every code generator shares.

`Walker` visits a kernel's statements, values and index expressions once and makes every decision
that is not spelling: which of the three forms an index division takes, which index expressions
may be evaluated where they are not needed, what a load with a validity condition or a guard
means, which accumulations are fused multiply-adds, which conversion a cast is (`conversion`),
that a storage type (bfloat16, and float16 where a backend holds it as bits) converts through
float32, that integer division runs in int64, that an update reads, combines and writes back (a
scatter into a storage type widened and rounded back once). A backend subclasses it and spells
each construct: its tables (`OPS`: meta-op -> expression template, `INDEX`: index op ->
template, `CAST`: conversion kind -> template, `WIDEN`/`NARROW`: storage conversions), rendered by
`form`, and the hooks below that raise NotImplementedError (a load, a store, a choice, a loop). A
text backend's `form` formats the template; LLVM's emits one instruction per `;`-separated part
and returns the SSA name of the last, so the same walk serves C-like text and SSA alike.

Templates name their operands {0} {1} {2}, earlier parts of an SSA form {r0} {r1}, and the fields
of `fields(source, dtype)` (the backend's type names) and {site} (an op's error site).
"""
from metagraph import dtypes
from metagraph.codegen.compiled import fused_product
from metagraph.compiler import ir
from metagraph.compiler.simplify import value_range
from metagraph.expr import Binary, Const, Extra, Select, Var

BOOLEAN = frozenset({"<", "<=", "==", "!=", "&&", "||"})     # index ops whose result is a truth value
DIVISIONS = frozenset({"idiv", "mod"})      # table ops computed in int64
KIND = {"b": "bool", "f": "float", "i": "signed", "u": "unsigned"}


def pure(expr):
    """Whether evaluating an index expression where it is not needed is harmless: no reads of
    index tensors (they may be out of bounds there) and no division that can report an error."""
    if isinstance(expr, Extra):
        return False
    if isinstance(expr, Binary):
        if expr.op in ("//", "%") and not isinstance(expr.b, Const):
            return False
        return pure(expr.a) and pure(expr.b)
    if isinstance(expr, Select):
        return pure(expr.cond) and pure(expr.a) and pure(expr.b)
    return True


def division(expr, extents):
    """How an index `//` or `%` is computed: "exact" (the machine's truncating division: a positive
    constant divisor of an operand that is never negative), "floor" (rounding toward minus
    infinity; the divisor cannot be zero), or "checked" (a zero divisor reports error -1)."""
    if isinstance(expr.b, Const) and expr.b.value > 0 and value_range(expr.a, extents)[0] >= 0:
        return "exact"
    low, high = value_range(expr.b, extents)
    return "floor" if low > 0 or high < 0 else "checked"


def conversion(source, target):
    """How C converts a value of `source` to `target` (neither a storage type): "nonzero" (to bool),
    "extend" or "narrow" (to a wider or narrower type of the same family), "same" (integers of one
    width), "to float" (from an integer), "to integer" (a float truncated toward zero) or "to narrow
    integer" (the same through int32, as x86 converts to integers narrower than that)."""
    if target == dtypes.bool_:
        return "nonzero"
    if source.is_float == target.is_float:
        if target.itemsize == source.itemsize:
            return "same"
        return "extend" if target.itemsize > source.itemsize else "narrow"
    if target.is_float:
        return "to float"
    return "to narrow integer" if target.itemsize < 4 else "to integer"


def op_form(table, op, dtype):
    """A table's template for `op` on operands of `dtype`: the entry for (op, dtype name), else for
    (op, kind: bool, float, signed or unsigned), else for op."""
    return table.get((op, dtype.name)) or table.get((op, KIND[dtype.kind])) or table[op]


class Walker:
    """Walks one kernel's IR; subclasses spell each construct (see the module's docstring)."""
    OPS = {}        # meta-op (or (op, dtype name or kind)) -> template
    INDEX = {}      # index op (("//" or "%", division form) for divisions) -> template
    # storage types, held as their bits and computed in float32 (bfloat16; float16 in some backends):
    WIDEN = {}      # storage dtype name -> its value as a float32
    NARROW = {}     # storage dtype name -> a float32 rounded to it; (name, source name) -> directly
    CAST = {}       # the other conversions: walker.conversion's kind (or (kind, source dtype or kind))

    def __init__(self, kernel):
        self.kernel, self.params, self.extents = kernel, kernel.params, kernel.extents
        self.accumulators = {}      # name -> its ir.Define
        self.lines = []

    def emit(self, line):
        """Add a line to the output (a backend may indent it)."""
        self.lines.append(line)

    # ---- what a backend spells: values ---------------------------------------------------------
    def literal(self, value, dtype):
        """A constant of `dtype`."""
        raise NotImplementedError

    def loop_variable(self, axis):
        """Loop variable `axis` (an int64)."""
        raise NotImplementedError

    def integer(self, value):
        """An int64 constant of an index expression."""
        return str(value)

    def choose(self, cond, then, otherwise, dtype, lazy):
        """then() where cond holds, else otherwise(), of `dtype`; lazy: each may be evaluated only
        on its own side (it reads memory or may fail)."""
        raise NotImplementedError

    def implies(self, valid, cond):
        """A truth value: cond() where valid holds (evaluated only there), else true."""
        raise NotImplementedError

    def guarded(self, cond, inner, fill, check, dtype):
        """inner where cond holds, else fill; else also the error `check` when it is not None."""
        raise NotImplementedError

    def element(self, param, index):
        """Element `index` of kernel parameter `param`, of the parameter's dtype."""
        raise NotImplementedError

    def read_accumulator(self, name, index):
        """An accumulator's value (its element `index` when it is an array, else index is None)."""
        raise NotImplementedError

    def index_value(self, index, dtype):
        """An int64 converted to `dtype`: an integer's truncated, a bool's too (its memory is uint8's)."""
        return self.convert(index, dtypes.int64, dtypes.uint8 if dtype == dtypes.bool_ else dtype)

    # ---- what a backend spells: statements (a text backend may return a line) ------------------
    def loop(self, s, names):
        """An ir.Loop with its body (each body statement through `statement`)."""
        raise NotImplementedError

    def define(self, s):
        """An ir.Define: an accumulator, initialised unless its init is None."""
        raise NotImplementedError

    def write_accumulator(self, name, index, v):
        """Accumulator `name` (its element `index` when it is an array, else index is None) set to v."""
        raise NotImplementedError

    def write(self, param, index, v):
        """Element `index` of kernel parameter `param` set to v (of the parameter's dtype)."""
        raise NotImplementedError

    def combine(self, op, a, b, dtype):
        """a combined with b by an accumulation's `op` (add, mul, max), of `dtype`: a value."""
        raise NotImplementedError

    def when(self, cond, update, check):
        """update() only where cond holds; elsewhere the error `check` when it is not None."""
        raise NotImplementedError

    # ---- what a backend may respell ------------------------------------------------------------
    def form(self, template, *operands, **fields):
        """A template with its operands and fields filled in (text backends: the text itself)."""
        return template.format(*operands, **fields)

    def fields(self, source, dtype):
        """The type names an op's template may use, for operands of `source` and a result of `dtype`."""
        return {}

    def bind(self, text, value):
        """A computed value's rendering kept for its later uses (a temporary, or itself)."""
        return text

    # ---- index expressions: int64 arithmetic and truth values --------------------------------
    def index(self, expr):
        """An index expression as an int64."""
        text, boolean = self._index(expr)
        return self.widen(text) if boolean else text

    def condition(self, expr):
        """An index expression as a truth value."""
        text, boolean = self._index(expr)
        return text if boolean else self.truth(text)

    def widen(self, text):
        """A truth value as an int64 (INDEX's "widen", where a backend's truth values are not)."""
        return self.form(self.INDEX["widen"], text) if "widen" in self.INDEX else text

    def truth(self, text):
        """An int64 as a truth value, nonzero (INDEX's "truth", where a backend's are not int64s)."""
        return self.form(self.INDEX["truth"], text) if "truth" in self.INDEX else text

    def _index(self, expr):
        """(rendering, whether it is a truth value) of an index expression."""
        if isinstance(expr, Var):
            return self.loop_variable(expr.axis), False
        if isinstance(expr, Const):
            return self.integer(expr.value), False
        if isinstance(expr, Select):
            lazy = not (pure(expr.a) and pure(expr.b))
            return self.choose(self.condition(expr.cond), lambda: self.index(expr.a),
                               lambda: self.index(expr.b), dtypes.int64, lazy), False
        if isinstance(expr, Extra):
            param = self.params[expr.index]
            offset = self.index(ir.extra_offset(param, expr.args))
            return self.convert(self.element(expr.index, offset), param.dtype, dtypes.int64), False
        op = expr.op
        if op in ("&&", "||"):
            a, truth = self._index(expr.a)
            a = a if truth else self.truth(a)
            if pure(expr.b):
                b, both = self._index(expr.b)
                # two truth values (0 or 1), the second pure: a table may give a form that
                # evaluates both, with no branch (an integer operand keeps the logical form)
                form = self.INDEX.get((op, "pure")) if truth and both else None
                return self.form(form or self.INDEX[op], a, b if both else self.truth(b)), True
            return self.short_circuit(op, a, lambda: self.condition(expr.b)), True
        a, b = self.index(expr.a), self.index(expr.b)
        key = (op, division(expr, self.extents)) if op in ("//", "%") else op
        return self.form(self.INDEX[key], a, b), op in BOOLEAN

    def short_circuit(self, op, a, rest):
        """a && rest() or a || rest(), where rest() is evaluated only when a does not decide."""
        return self.form(self.INDEX[op], a, rest())

    # ---- values --------------------------------------------------------------------------------
    def value(self, value, names):
        """A value's rendering; `names` holds those already computed (each is computed once)."""
        if id(value) in names:
            return names[id(value)]
        if isinstance(value, ir.Scalar):
            return self.literal(value.value, value.dtype)
        if isinstance(value, ir.Ref):
            text = self.read_accumulator(value.name, None if value.index is None else self.index(value.index))
        elif isinstance(value, ir.IndexValue):
            text = self.index_value(self.index(value.expr), value.dtype)
        elif isinstance(value, ir.Load):
            text = self.load(value)
        elif isinstance(value, ir.Guard):
            text = self.guard(value, names)
        else:
            text = self.apply(value, [self.value(arg, names) for arg in value.args])
        names[id(value)] = self.bind(text, value)
        return names[id(value)]

    def load(self, value):
        """A Load: its element converted to the dtype it is read as (float16 and bfloat16 memory is
        read as float32), and nothing read where `valid` is false (0 results there)."""
        stored = self.params[value.param].dtype

        def read():
            return self.convert(self.element(value.param, self.index(value.index)), stored, value.dtype)
        if value.valid is None:
            return read()
        return self.choose(self.condition(value.valid), read, lambda: self.zero(value.dtype), value.dtype,
                           lazy=True)

    def guard(self, value, names):
        """A Guard: its value where the condition holds, else the fill (or an error at `check`);
        where `valid` is false the condition is not evaluated (it may read out of bounds)."""
        inner = self.value(value.value, names)
        if value.valid is None:
            cond = self.condition(value.cond)
        else:
            cond = self.implies(self.condition(value.valid), lambda: self.condition(value.cond))
        return self.guarded(cond, inner, self.literal(value.fill, value.dtype), value.check, value.dtype)

    def apply(self, value, args):
        """A table op from the backend's OPS (a cast from `convert`). Integer division and modulo
        are computed in int64 (OPS' int64 form), their operands widened and the result truncated."""
        source, dtype = (value.args[0].dtype if value.args else value.dtype), value.dtype
        if value.op == "cast":
            return self.convert(args[0], source, dtype)
        if value.op in DIVISIONS and source != dtypes.int64:
            wide = [self.convert(arg, source, dtypes.int64) for arg in args]
            result = self.form(op_form(self.OPS, value.op, dtypes.int64), *wide, site=value.site,
                               **self.fields(dtypes.int64, dtypes.int64))
            return self.convert(result, dtypes.int64, dtype)
        return self.form(op_form(self.OPS, value.op, source), *args, site=value.site,
                         **self.fields(source, dtype))

    def zero(self, dtype):
        """What a load that is not valid gives."""
        return self.literal(0, dtype)

    def accumulate(self, define, index, op, v, dtype):
        """Accumulator `define` (element `index`) combined by `op` with v, of `dtype`: read,
        combined, written back (a backend may respell it as an update in place)."""
        old = self.read_accumulator(define.name, index)
        new = self.combine(op, old, self.convert(v, dtype, define.dtype), define.dtype)
        return self.write_accumulator(define.name, index, new)

    def combine_memory(self, param, index, op, v, dtype):
        """Element `index` of parameter `param` combined by `op` with v, in the memory's dtype."""
        return self.write(param, index, self.combine(op, self.element(param, index), v, dtype))

    def widened_update(self, param, index, op, v, wide):
        """Element `index` of float16 or bfloat16 memory combined by `op` with v: read as `wide`,
        combined, rounded back once."""
        stored = self.params[param].dtype
        old = self.convert(self.element(param, index), stored, wide)
        return self.write(param, index, self.convert(self.combine(op, old, v, wide), wide, stored))

    def convert(self, x, source, target):
        """x converted from `source` to `target` as C converts (to bool: != 0); a storage type
        through float32 (WIDEN's, then NARROW's), unless NARROW converts from `source` directly."""
        if source is target:
            return x
        if source.name in self.WIDEN:
            return self.convert(self.from_storage(x, source), dtypes.float32, target)
        if (target.name, source.name) in self.NARROW:
            return self.form(self.NARROW[target.name, source.name], x)
        if target.name in self.NARROW:
            return self.to_storage(self.convert(x, source, dtypes.float32), target)
        return self.cast(x, source, target)

    def cast(self, x, source, target):
        """x converted from `source` to `target`, neither a storage type: CAST's template for the
        conversion's kind (by the source's dtype or kind), x itself where that is None."""
        template = op_form(self.CAST, conversion(source, target), source)
        return x if template is None else self.form(template, x, **self.fields(source, target))

    def from_storage(self, x, dtype):
        """A storage type's value as a float32."""
        return self.form(self.WIDEN[dtype.name], x)

    def to_storage(self, wide, dtype):
        """A float32 rounded to a storage type."""
        return self.form(self.NARROW[dtype.name], wide)

    # ---- statements ----------------------------------------------------------------------------
    def statement(self, s, names=None):
        """Render one statement (its hook's result: text backends may return a structure)."""
        names = {} if names is None else names
        if isinstance(s, ir.Loop):
            return self.loop(s, names)
        if isinstance(s, ir.Define):
            self.accumulators[s.name] = s
            return self.define(s)
        if isinstance(s, ir.Accumulate):
            return self.accumulation(s, names)
        if isinstance(s, ir.Assign):
            return self.write_accumulator(s.name, self.index(s.index), self.value(s.value, names))
        if isinstance(s, ir.Store):
            return self.write(s.param, self.index(s.index), self.value(s.value, names))
        return self.scatter(s, names)

    def accumulation(self, s, names):
        """An Accumulate: a fused multiply-add (OPS' "fma": a * b + c rounded once) where
        compiled.fused_product finds one (made only where its guard's condition holds), else the
        accumulator combined with the value."""
        define = self.accumulators[s.name]
        product = fused_product(s, define.dtype)
        if product is None:
            index = None if s.index is None else self.index(s.index)
            return self.accumulate(define, index, s.op, self.value(s.value, names), s.value.dtype)
        a, b = (self.value(arg, names) for arg in product[:2])
        cond = None if product[2] is None else self.condition(product[2])
        index = self.index(s.index)
        old = self.read_accumulator(define.name, index)
        fields = self.fields(define.dtype, define.dtype)
        new = self.form(op_form(self.OPS, "fma", define.dtype), a, b, old, **fields)
        if cond is not None:
            new = self.choose(cond, lambda: new, lambda: old, define.dtype, lazy=False)
        return self.write_accumulator(define.name, index, new)

    def scatter(self, s, names):
        """A ScatterAccumulate: memory[index] op= value, only where `valid` holds (the index is not
        computed elsewhere), else the error `check` when there is one. Memory of a storage type is
        read as float32, combined, and rounded back once."""
        stored = self.params[s.param].dtype
        wide = dtypes.computed_in(stored)
        v = self.convert(self.value(s.value, names), s.value.dtype, wide)

        def update():
            index = self.index(s.index)
            if wide is stored:
                return self.combine_memory(s.param, index, s.op, v, wide)
            return self.widened_update(s.param, index, s.op, v, wide)
        if s.valid is None:
            return update()
        return self.when(self.condition(s.valid), update, s.check)
