"""Range-aware simplification of index expressions.

Every loop variable i<k> has a known range [0, extent_k). Knowing ranges lets `(a*n + b) // n`
become `a` and `(a*n + b) % n` become `b` when 0 <= b < n, so that a chain of views (transpose,
slice, reshape) composes into plain address arithmetic instead of a pile of divisions.
"""
from metagraph.expr import Binary, Const, Extra, Select, Var, linear_terms

INF = float("inf")


def substitute(expr, values):
    """expr with each Var(k) replaced by values[k] (composition of index maps)."""
    if isinstance(expr, Var):
        return values[expr.axis]
    if isinstance(expr, Const):
        return expr
    if isinstance(expr, Binary):
        return Binary(expr.op, substitute(expr.a, values), substitute(expr.b, values))
    if isinstance(expr, Select):
        return Select(substitute(expr.cond, values), substitute(expr.a, values), substitute(expr.b, values))
    return Extra(expr.index, tuple(substitute(arg, values) for arg in expr.args))


def value_range(expr, extents):
    """(low, high), inclusive bounds of expr's value; +-inf where unknown."""
    if isinstance(expr, Var):
        return 0, extents[expr.axis] - 1
    if isinstance(expr, Const):
        return expr.value, expr.value
    if isinstance(expr, Select):
        (la, ha), (lb, hb) = value_range(expr.a, extents), value_range(expr.b, extents)
        return min(la, lb), max(ha, hb)
    if isinstance(expr, Extra):
        return -INF, INF
    (la, ha), (lb, hb) = value_range(expr.a, extents), value_range(expr.b, extents)
    op = expr.op
    if op == "+":
        return la + lb, ha + hb
    if op == "-":
        return la - hb, ha - lb
    if op == "*":
        products = [_mul(x, y) for x in (la, ha) for y in (lb, hb)]
        return min(products), max(products)
    if op == "min":
        return min(la, lb), min(ha, hb)
    if op == "max":
        return max(la, lb), max(ha, hb)
    if op in ("//", "%") and lb == hb and lb > 0:
        n = lb
        if op == "//":
            low = -INF if la == -INF else la // n
            high = INF if ha == INF else ha // n
            return low, high
        return (la, ha) if 0 <= la and ha < n else (0, n - 1)
    if op in ("<", "<=", "==", "!=", "&&", "||"):
        return 0, 1
    return -INF, INF


def _mul(x, y):
    if x == 0 or y == 0:
        return 0
    return x * y


def _sum(terms, const):
    """Rebuild a canonical sum: terms in a stable order, constant last."""
    result = None
    for term, coef in sorted(terms.items(), key=lambda item: str(item[0])):
        part = term if coef == 1 else Binary("*", term, Const(coef))
        if coef < 0 and result is not None:
            part = term if coef == -1 else Binary("*", term, Const(-coef))
            result = Binary("-", result, part)
            continue
        result = part if result is None else Binary("+", result, part)
    if result is None:
        return Const(const)
    if const > 0:
        return Binary("+", result, Const(const))
    if const < 0:
        return Binary("-", result, Const(-const))
    return result


def simplify(expr, extents):
    """An equivalent, simpler expression, given each loop variable's extent."""
    if isinstance(expr, (Var, Const)):
        return expr
    if isinstance(expr, Select):
        cond = simplify(expr.cond, extents)
        a, b = simplify(expr.a, extents), simplify(expr.b, extents)
        low, high = value_range(cond, extents)
        if low > 0 or high < 0:
            return a
        if low == high == 0:
            return b
        return a if a == b else Select(cond, a, b)
    if isinstance(expr, Extra):
        return Extra(expr.index, tuple(simplify(arg, extents) for arg in expr.args))
    a, b = simplify(expr.a, extents), simplify(expr.b, extents)
    if isinstance(a, Const) and isinstance(b, Const) and not (expr.op in ("//", "%") and b.value == 0):
        return Const(_fold(expr.op, a.value, b.value))
    if expr.op in ("+", "-", "*"):
        terms, const = linear_terms(Binary(expr.op, a, b))
        return _sum(*_recombined(terms, const))
    if expr.op in ("//", "%") and isinstance(b, Const) and b.value > 0:
        return _divide(expr.op, a, b.value, extents)
    if expr.op in ("min", "max", "<", "<=", "==", "!=", "&&", "||"):
        folded = _fold_by_range(expr.op, a, b, extents)
        if folded is not None:
            return folded
    return Binary(expr.op, a, b)


def _recombined(terms, const):
    """(terms, const) with every pair (a % n) * c + (a // n) * (c * n) replaced by a * c (floor
    division and modulo: a = (a // n) * n + a % n), as a view that splits a dimension by a
    stride and one that reads both parts back leave them (a pooling window over stride phases)."""
    for term in [t for t in terms if isinstance(t, Binary) and t.op == "%" and isinstance(t.b, Const)]:
        whole, coef = Binary("//", term.a, term.b), terms.get(term)
        if term.b.value > 0 and coef and terms.get(whole) == coef * term.b.value:
            del terms[term], terms[whole]
            inner, offset = linear_terms(term.a)
            for t, c in inner.items():
                terms[t] = terms.get(t, 0) + c * coef
            terms, const = {t: c for t, c in terms.items() if c}, const + offset * coef
    return terms, const


def _divide(op, a, n, extents):
    terms, const = linear_terms(a)
    whole = {t: c // n for t, c in terms.items() if c % n == 0}
    rest_terms = {t: c for t, c in terms.items() if c % n}
    rest = _sum(rest_terms, const % n)
    low, high = value_range(rest, extents)
    if 0 <= low and high < n:
        if op == "//":
            return _sum(whole, const // n)
        return rest
    if n == 1:
        return a if op == "//" else Const(0)
    return Binary(op, a, Const(n))


def _first(*choices):
    """The value of the first (condition, value) pair whose condition holds, else None."""
    return next((value for condition, value in choices if condition), None)


def _fold_by_range(op, a, b, extents):
    (la, ha), (lb, hb) = value_range(a, extents), value_range(b, extents)
    if op == "min":
        return _first((ha <= lb, a), (hb <= la, b))
    if op == "max":
        return _first((la >= hb, a), (lb >= ha, b))
    if op == "<":
        return _first((ha < lb, Const(1)), (la >= hb, Const(0)))
    if op == "<=":
        return _first((ha <= lb, Const(1)), (la > hb, Const(0)))
    if op == "&&":
        if (la > 0 or ha < 0) and (lb > 0 or hb < 0):
            return Const(1)
        if (la > 0 or ha < 0):
            return b
        if (lb > 0 or hb < 0):
            return a
        return Const(0) if (la == ha == 0 or lb == hb == 0) else None
    if op == "||":
        if la > 0 or ha < 0 or lb > 0 or hb < 0:
            return Const(1)
        return _first((la == ha == 0, b), (lb == hb == 0, a))
    return None


def _fold(op, a, b):
    return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0,
            "min": min(a, b), "max": max(a, b), "<": int(a < b), "<=": int(a <= b), "==": int(a == b),
            "!=": int(a != b), "&&": int(bool(a) and bool(b)), "||": int(bool(a) or bool(b))}[op]
