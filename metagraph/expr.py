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
        if len(group_source) == 1 and len(group_target) == 1 and source[group_source[0]] == target[group_target[0]]:
            index_map[group_source[0]] = Var(group_target[0])      # an unchanged dimension, 1 too (a
            continue                                                # batch of one stays the batch)
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


INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def check_int64(expr, extents):
    """Raise ExprError where some subexpression of `expr` can leave int64 while loop variable k
    runs over [0, extents[k]): kernels compute index arithmetic in int64, so such an index would
    wrap silently. A value read from an extra tensor is any int64 and proves nothing; arithmetic
    on it is left to the kernel's bounds check. Iterative: expressions may be long chains."""
    ranges = {}
    for e, parts in _postorder(expr):
        found = _range(e, [ranges[id(p)] for p in parts], extents)
        if found is not None and (found[0] < INT64_MIN or found[1] > INT64_MAX):
            what = f"the constant {e.value} is" if isinstance(e, Const) else \
                f"{_short(e)} reaches {found[0] if found[0] < INT64_MIN else found[1]}, which is"
            raise ExprError(f"index expression {_short(expr)}: {what} outside int64 (loop extents "
                            f"{tuple(extents)})")
        ranges[id(e)] = found


def _postorder(expr):
    """(subexpression, its parts) for each distinct subexpression, parts first; iterative, since
    an expression may be a chain of thousands."""
    done, stack = set(), [(expr, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in done:
            continue
        parts = _parts(e)
        if not ready and parts:
            stack.append((e, True))
            stack.extend((p, False) for p in parts)
            continue
        done.add(id(e))
        yield e, parts


def _short(expr, limit=120):
    text = str(expr) if _size_below(expr, limit) else "<a long expression>"
    return text if len(text) <= limit else text[:limit] + "..."


def _size_below(expr, limit):
    stack, count = [expr], 0
    while stack and count < limit:
        count += 1
        stack.extend(_parts(stack.pop()))
    return not stack


def _parts(e):
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Extra):
        return tuple(e.args)
    return ()


def _range(e, parts, extents):
    """(low, high) of e given its parts' ranges (None: unknown)."""
    if isinstance(e, Const):
        return e.value, e.value
    if isinstance(e, Var):
        return 0, max(extents[e.axis] - 1, 0)
    if isinstance(e, Extra):
        return None
    if isinstance(e, Select) or e.op in ("<", "<=", "==", "!=", "&&", "||"):
        if isinstance(e, Binary) or None in parts[1:]:
            return (0, 1) if isinstance(e, Binary) else None
        return min(parts[1][0], parts[2][0]), max(parts[1][1], parts[2][1])
    if None in parts:
        return None
    (la, ha), (lb, hb) = parts
    if e.op == "+":
        return la + lb, ha + hb
    if e.op == "-":
        return la - hb, ha - lb
    if e.op == "*":
        products = (la * lb, la * hb, ha * lb, ha * hb)
        return min(products), max(products)
    if e.op in ("min", "max"):
        pick = min if e.op == "min" else max
        return pick(la, lb), pick(ha, hb)
    largest = max(abs(la), abs(ha)) if e.op == "//" else max(abs(lb), abs(hb))
    return -largest, largest          # // never grows |a|; % stays below |b|


# A user's index expression is bounded: every pass over an expression (parsing, simplification,
# lowering, rendering) recurses along its nesting, and the compiled backends' passes reach Python's
# recursion limit at 400-600 levels.
MAX_DEPTH = 200         # nesting levels
MAX_NODES = 10_000      # nodes, a subexpression counted each time it is read (tokens, in a string)
_TOKEN = re.compile(r"\w+|\S")


def parse(text, num_vars, num_extras=0):
    """Parse an index expression string over i0..i<num_vars-1> into an Expr (an Expr given is
    checked against the size limits and returned)."""
    if isinstance(text, Expr):
        check_size(text)
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        return Const(text)
    if not isinstance(text, str):
        raise ExprError(f"index expression must be a string or int, got {type(text).__name__}")
    source = _EXTRA_CALL.sub(r"__extra\1(", text).replace("&&", " and ").replace("||", " or ")
    tokens = len(_TOKEN.findall(source))
    if tokens > MAX_NODES:
        raise ExprError(f"index expression {_clipped(text)} has {tokens} tokens, more than the limit "
                        f"of {MAX_NODES}")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as error:
        raise ExprError(f"index expression {_clipped(text)} is not valid syntax: {error.msg}") from None
    except RecursionError:          # Python's own parser recurses along the nesting
        tree = None
    if tree is None or _ast_depth(tree.body) > MAX_DEPTH:
        raise ExprError(f"index expression {_clipped(text)} is nested more than {MAX_DEPTH} levels "
                        "deep (the limit)")
    return _Parser(text, num_vars, num_extras).visit(tree.body)


def check_size(expr):
    """Raise ExprError for an expression nested more than MAX_DEPTH levels deep or of more than
    MAX_NODES nodes. Iterative, and linear in the distinct subexpressions."""
    depth, size = {}, {}
    for e, parts in _postorder(expr):
        depth[id(e)] = 1 + max((depth[id(p)] for p in parts), default=0)
        size[id(e)] = 1 + sum(size[id(p)] for p in parts)
    if depth[id(expr)] > MAX_DEPTH:
        raise ExprError(f"index expression {_short(expr)} is nested {depth[id(expr)]} levels deep, "
                        f"more than the limit of {MAX_DEPTH}")
    if size[id(expr)] > MAX_NODES:
        raise ExprError(f"index expression {_short(expr)} has {size[id(expr)]} nodes, more than the "
                        f"limit of {MAX_NODES}")


def _ast_depth(tree):
    deepest, stack = 0, [(tree, 1)]
    while stack and deepest <= MAX_DEPTH:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node)
                     if not isinstance(child, ast.expr_context))
    return deepest


def _clipped(text, limit=80):
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


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
