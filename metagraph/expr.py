"""Index expressions: integer expressions over loop variables i0, i1, ... (and extra tensors).

They are the index maps of `reindex` and `reindex_reduce`: each input dimension gets one
expression over the output's loop variables. Users may write them as strings, which are parsed
with Python's `ast` into this tree (never evaluated). `//` and `%` round toward minus infinity,
as in Python. `@e0(i0, i1)` reads integer tensor extra 0 at (i0, i1).
"""
import ast
import re
from dataclasses import dataclass

from metagraph.errors import ExprError

class Expr:
    """Base of the expression tree; arithmetic operators build new nodes."""
    __slots__ = ()

    def __add__(self, other):
        return Binary("+", self, lift(other))

    def __radd__(self, other):
        return Binary("+", lift(other), self)

    def __sub__(self, other):
        return Binary("-", self, lift(other))

    def __rsub__(self, other):
        return Binary("-", lift(other), self)

    def __mul__(self, other):
        return Binary("*", self, lift(other))

    def __rmul__(self, other):
        return Binary("*", lift(other), self)

    def __floordiv__(self, other):
        return Binary("//", self, lift(other))

    def __mod__(self, other):
        return Binary("%", self, lift(other))

    def __neg__(self):
        return Binary("-", Const(0), self)


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """Loop variable i<axis>."""
    axis: int

    def __str__(self):
        return f"i{self.axis}"


@dataclass(frozen=True, slots=True)
class Const(Expr):
    """An integer constant."""
    value: int

    def __str__(self):
        return str(self.value)


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    """a <op> b, op one of + - * // % min max < <= == != && ||; comparisons and logic give 0 or 1."""
    op: str
    a: Expr
    b: Expr

    def __str__(self):
        if self.op in ("min", "max"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """a if cond else b."""
    cond: Expr
    a: Expr
    b: Expr

    def __str__(self):
        return f"({self.a} if {self.cond} else {self.b})"


@dataclass(frozen=True, slots=True)
class Extra(Expr):
    """The value of integer tensor extra <index> at the given indices."""
    index: int
    args: tuple

    def __str__(self):
        return f"@e{self.index}({', '.join(map(str, self.args))})"


def lift(value):
    """An Expr from an Expr or a Python int."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExprError(f"index expressions hold integers, got {value!r}")
    return Const(value)


def binary(op, a, b):
    """Build a <op> b (for ops without a Python operator: min, max, comparisons, logic)."""
    return Binary(op, lift(a), lift(b))


def variables(expr):
    """The set of loop-variable axes an expression reads."""
    if isinstance(expr, Var):
        return {expr.axis}
    if isinstance(expr, Const):
        return set()
    if isinstance(expr, Binary):
        return variables(expr.a) | variables(expr.b)
    if isinstance(expr, Select):
        return variables(expr.cond) | variables(expr.a) | variables(expr.b)
    return set().union(*(variables(arg) for arg in expr.args))


def extras_used(expr):
    """The set of extra-tensor indices an expression reads."""
    if isinstance(expr, (Var, Const)):
        return set()
    if isinstance(expr, Binary):
        return extras_used(expr.a) | extras_used(expr.b)
    if isinstance(expr, Select):
        return extras_used(expr.cond) | extras_used(expr.a) | extras_used(expr.b)
    return {expr.index}.union(*(extras_used(arg) for arg in expr.args))


def linear_terms(expr):
    """expr as ({term: coefficient}, constant) when it is a sum of scaled terms (else {expr: 1})."""
    if isinstance(expr, Const):
        return {}, expr.value
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        terms_a, const_a = linear_terms(expr.a)
        terms_b, const_b = linear_terms(expr.b)
        sign = 1 if expr.op == "+" else -1
        for term, coef in terms_b.items():
            terms_a[term] = terms_a.get(term, 0) + sign * coef
        return {t: c for t, c in terms_a.items() if c}, const_a + sign * const_b
    scaled = isinstance(expr, Binary) and expr.op == "*"
    if scaled and (isinstance(expr.a, Const) or isinstance(expr.b, Const)):
        scale, rest = (expr.a.value, expr.b) if isinstance(expr.a, Const) else (expr.b.value, expr.a)
        terms, const = linear_terms(rest)
        return {t: c * scale for t, c in terms.items() if c * scale}, const * scale
    return {expr: 1}, 0


def reshape_map(source, target):
    """The index map that reads `source` (row-major) from `target`'s loop variables.

    Dimensions are matched in groups whose sizes multiply to the same total, so that merging or
    splitting neighbouring dimensions costs one division at most, and an unchanged dimension none."""
    index_map = [None] * len(source)
    i = j = 0
    while i < len(source) or j < len(target):
        group_source, group_target, size_source, size_target = [], [], 1, 1
        while True:
            if i < len(source) and (size_source <= size_target or j >= len(target)) and \
                    (not group_source or size_source != size_target or source[i] == 1):
                group_source.append(i)
                size_source *= source[i]
                i += 1
            elif j < len(target) and (not group_target or size_source != size_target or target[j] == 1):
                group_target.append(j)
                size_target *= target[j]
                j += 1
            else:
                break
            if size_source == size_target and (i >= len(source) or source[i] != 1) and \
                    (j >= len(target) or target[j] != 1):
                break
        flat, stride = Const(0), 1
        for k in reversed(group_target):
            if target[k] != 1:
                term = Var(k) if stride == 1 else Var(k) * stride
                flat = term if flat == Const(0) else term + flat
            stride *= target[k]
        stride = 1
        for position, d in enumerate(reversed(group_source)):
            if source[d] == 1:
                index_map[d] = Const(0)
                continue
            index = flat // stride if stride != 1 else flat
            first = all(source[e] == 1 for e in group_source[:group_source.index(d)])
            index_map[d] = index if first else index % source[d]
            stride *= source[d]
    return tuple(index_map)


# ---- parsing -------------------------------------------------------------------------------

_AST_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_AST_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!="}
_VAR_NAME = re.compile(r"i(\d+)\Z")
_EXTRA_CALL = re.compile(r"@e(\d+)\s*\(")
_EXTRA_NAME = re.compile(r"__extra(\d+)\Z")


def parse(text, num_vars, num_extras=0):
    """Parse an index expression string over i0..i<num_vars-1> into an Expr."""
    if isinstance(text, Expr):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        return Const(text)
    if not isinstance(text, str):
        raise ExprError(f"index expression must be a string or int, got {type(text).__name__}")
    source = _EXTRA_CALL.sub(r"__extra\1(", text).replace("&&", " and ").replace("||", " or ")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as error:
        raise ExprError(f"index expression {text!r} is not valid syntax: {error.msg}") from None
    return _Parser(text, num_vars, num_extras).visit(tree.body)


class _Parser:
    def __init__(self, text, num_vars, num_extras):
        self.text, self.num_vars, self.num_extras = text, num_vars, num_extras

    def error(self, what):
        raise ExprError(f"index expression {self.text!r}: {what}")

    def visit(self, node):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                self.error(f"constant {node.value!r} is not an integer")
            return Const(node.value)
        if isinstance(node, ast.Name):
            match = _VAR_NAME.match(node.id)
            if not match:
                self.error(f"unknown name {node.id!r}; loop variables are i0..i{self.num_vars - 1}")
            axis = int(match.group(1))
            if axis >= self.num_vars:
                self.error(f"{node.id} is out of range; loop variables are i0..i{self.num_vars - 1}")
            return Var(axis)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.visit(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return self.visit(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_BINARY:
            return Binary(_AST_BINARY[type(node.op)], self.visit(node.left), self.visit(node.right))
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.BoolOp):
            op = "&&" if isinstance(node.op, ast.And) else "||"
            result = self.visit(node.values[0])
            for value in node.values[1:]:
                result = Binary(op, result, self.visit(value))
            return result
        if isinstance(node, ast.IfExp):
            return Select(self.visit(node.test), self.visit(node.body), self.visit(node.orelse))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return self.call(node.func.id, node.args)
        self.error(f"unsupported syntax {ast.dump(node)[:60]}; allowed: integers, i0.., + - * // %, "
                   "min, max, comparisons, and/or (&&, ||), 'a if c else b', @e0(...)")

    def compare(self, node):
        parts = [self.visit(node.left)] + [self.visit(c) for c in node.comparators]
        result = None
        for op, left, right in zip(node.ops, parts, parts[1:]):
            if isinstance(op, (ast.Gt, ast.GtE)):          # a > b is b < a
                op, left, right = (ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()), right, left
            if type(op) not in _AST_COMPARE:
                self.error(f"unsupported comparison {type(op).__name__}")
            term = Binary(_AST_COMPARE[type(op)], left, right)
            result = term if result is None else Binary("&&", result, term)
        return result

    def call(self, name, args):
        extra = _EXTRA_NAME.match(name)
        if name not in ("min", "max") and not extra:
            self.error(f"unknown function {name!r}; allowed: min, max, @eK(...)")
        args = [self.visit(arg) for arg in args]
        if name in ("min", "max"):
            if len(args) < 2:
                self.error(f"{name}() takes at least two arguments")
            result = args[0]
            for arg in args[1:]:
                result = Binary(name, result, arg)
            return result
        index = int(extra.group(1))
        if index >= self.num_extras:
            self.error(f"@e{index} names extra {index}, but {self.num_extras} extras were given")
        return Extra(index, tuple(args))
