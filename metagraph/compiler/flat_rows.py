"""Flat rows: the innermost loops of an element-wise nest merged into one range and marked the vector
loop, rewrites of the finished kernel IR.

- `merge(loop)`: a loop whose body is one serial loop, around stores that read both loops' variables
  as one flat range (every index is outer * (c * inner extent) + inner * c plus terms of neither),
  becomes that inner loop alone over both ranges. A 3x3 weight's SGD update becomes one loop of
  4608 elements per filter instead of loops of 512, 3 and 3 (7.1 -> 2.7 ms a call).
- `vectorise(loop)`: a serial loop of stores that each write one element further per step, and
  read at most STRIDE_MAX elements further (at least one read) or the same one (no output
  parameter; a condition along the loop is a lane mask: a padded copy of a stride-2 conv's
  input (then split into stride phases), 6.5 -> 1.6 ms in MobileNetV2 with the C renderer's
  clamped strided loads), is the vector loop, whose iterations code generators may run at once
  (C: `omp simd`). GCC 12 ignores `restrict` on the pointers a kernel loads from its arguments
  and checks aliasing at run time for at most 10 pairs: a batch-norm backward reading 12 arrays
  over 4x4 planes ran scalar, 149 us a call, 25 us vectorised.

`flattened` is the rule that applies both wherever they hold, below the parallel loop (which keeps
its extent for the threads); each chain of loops is decided from one walk over its stores' index
expressions and rewritten once (pair by pair, every index was simplified again per pair).
"""
from metagraph.compiler import ir
from metagraph.compiler.access import STRIDE_MAX, Replace
from metagraph.compiler.rewrites import rewritten_body
from metagraph.expr import Const, Var, linear_terms, variables


def merge(loop, extents):
    """`loop` and the serial loop that is its body as that inner loop over both ranges, with
    `loop`'s kind (see the module docstring); raises ValueError where they are not read flat."""
    inner = loop.body[0] if len(loop.body) == 1 and isinstance(loop.body[0], ir.Loop) else None
    if inner is None or inner.kind != ir.SERIAL or not _stores_only(inner.body) or \
            not _Row(inner.body).flat(loop.var, inner.var, inner.extent):
        raise ValueError("merge: the loop's body is not one loop of stores that read both loops as one range")
    extents[inner.var] = loop.extent * inner.extent
    body = rewritten_body(inner.body, Replace({loop.var: Const(0)}), extents)
    return ir.Loop(inner.var, loop.extent * inner.extent, loop.kind, body)


def vectorise(loop, params):
    """`loop` marked the vector loop (see the module docstring); raises ValueError where its
    iterations do not write apart or do not read with unit stride."""
    if loop.kind != ir.SERIAL or not _stores_only(loop.body) or not _Row(loop.body).apart(loop.var, params):
        raise ValueError("vectorise: the loop is not a serial loop of stores that write apart and read "
                         "along it with unit stride")
    return ir.Loop(loop.var, loop.extent, ir.VECTOR, loop.body)


def flattened(body, extents, params):
    """The body with `merge` and then `vectorise` applied wherever they hold (module docstring)."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop):
            chain = [s]
            while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], ir.Loop):
                chain.append(chain[-1].body[0])
            s = _flattened_chain(chain, extents, params)
        out.append(s)
    return out


def _flattened_chain(chain, extents, params):
    """A chain of perfectly nested loops with its innermost serial loops merged as far out as every
    store reads them flat, and the innermost marked the vector loop where it writes apart."""
    innermost = chain[-1]
    if not _stores_only(innermost.body):
        body, kind = flattened(innermost.body, extents, params), innermost.kind
    else:
        body, row = innermost.body, _Row(innermost.body)
        merged, width = 0, innermost.extent
        for outer in reversed(chain[:-1]):
            if innermost.kind != ir.SERIAL or outer.kind != ir.SERIAL or \
                    not row.flat(outer.var, innermost.var, width):
                break
            merged, width = merged + 1, width * outer.extent
        if merged:
            extents[innermost.var] = width
            zero = Replace({loop.var: Const(0) for loop in chain[len(chain) - 1 - merged:-1]})
            body = rewritten_body(body, zero, extents)
            chain = chain[:len(chain) - 1 - merged] + [ir.Loop(innermost.var, width, ir.SERIAL, body)]
            innermost = chain[-1]
        vector = innermost.kind == ir.SERIAL and row.apart(innermost.var, params)
        kind = ir.VECTOR if vector else innermost.kind
    out = ir.Loop(innermost.var, innermost.extent, kind, body)
    for loop in reversed(chain[:-1]):
        out = ir.Loop(loop.var, loop.extent, loop.kind, [out])
    return out


def _stores_only(body):
    return bool(body) and all(isinstance(s, ir.Store) for s in body)


class _Row:
    """The index expressions of a loop body of stores, from one walk: the linear terms of the
    stores' indices, of the loads', and of every other index (conditions, index values, local
    arrays), the conditions themselves, and the parameters the loads read."""

    def __init__(self, stores):
        self.stores = [linear_terms(s.index)[0] for s in stores]
        self.loads, self.others, self.conditions, self.params = [], [], [], set()
        seen = set()
        for s in stores:
            for v in ir.values(s.value):
                if id(v) in seen:
                    continue
                seen.add(id(v))
                if isinstance(v, ir.Load):
                    self.loads.append(linear_terms(v.index)[0])
                    self.params.add(v.param)
                    self.conditions += [v.valid] if v.valid is not None else []
                elif isinstance(v, ir.Guard):
                    self.conditions += [c for c in (v.cond, v.valid) if c is not None]
                else:
                    self.others += [linear_terms(expr)[0] for expr in ir.index_expressions(v)]
        self.others += [linear_terms(c)[0] for c in self.conditions]

    def flat(self, outer, inner, inner_extent):
        """Whether every index reads loop variables outer and inner only as outer * (c *
        inner_extent) + inner * c (or not at all): one variable over both ranges can replace them."""
        every = self.stores + self.loads + self.others
        return all(_flat(terms, outer, inner, inner_extent) for terms in every)

    def apart(self, var, params):
        """Whether each store writes one element further per step of `var`, and each load reads at
        most STRIDE_MAX elements further (a strided conv's input) or the same one, some load
        further (a loop that reads nothing along it, a buffer's clearing, needs no aliasing checks:
        compilers vectorise it unaided), with no output read. Conditions along `var` (a padded
        row's border) become lane masks."""
        if any(params[p].output for p in self.params):
            return False
        return all(_stride(terms, var) == 1 for terms in self.stores) and \
            all(_stride(terms, var) in range(STRIDE_MAX + 1) for terms in self.loads) and \
            any(_stride(terms, var) for terms in self.loads)


def _flat(terms, outer, inner, inner_extent):
    if any(term not in (Var(outer), Var(inner)) and variables(term) & {outer, inner} for term in terms):
        return False
    return terms.get(Var(outer), 0) == terms.get(Var(inner), 0) * inner_extent


def _stride(terms, var):
    """The constant step of an index along `var`, or None where `var` is read other than linearly."""
    if any(term != Var(var) and var in variables(term) for term in terms):
        return None
    return terms.get(Var(var), 0)
