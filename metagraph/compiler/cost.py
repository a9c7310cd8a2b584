"""A roofline-style estimate of a kernel body's running time, in core cycles: the search's cost
model (pipeline/tuning.py ranks a kernel's variants by it and times only the cheapest few).

Two bounds, the larger wins:
- **issue**: every loop body's statements need so many vector arithmetic operations, loads and
  stores per iteration; a core issues ARITHMETIC_PER_CYCLE, LOADS_PER_CYCLE and STORES_PER_CYCLE
  of them per cycle. A load that moves by one element per step of the vectorised loop is one
  vector load; one that does not move with it is read once around that loop; any other stride
  is a gather of one load per lane. A reduction's loop also waits ACCUMULATE_LATENCY cycles per
  iteration for its accumulators' previous update: a body with few independent accumulators is
  latency-bound, one with a register tile of them is not; a tile with more accumulators than the
  registers hold, beside an operand, spills the rest.
- **memory**: each parameter a load reads is moved from memory once (MEMORY_BYTES_PER_CYCLE),
  and again, from the shared cache where it fits there, for every iteration of a loop it does not
  depend on whose body reads more than CACHE_BYTES in all (a panel that does not stay in the
  core's cache between the rows that reuse it).
A parallel loop divides both among the threads it can keep busy. The figures rank variants of
one kernel against each other; they do not predict seconds.
"""
import math
from dataclasses import dataclass

from metagraph.compiler import ir
from metagraph.compiler.access import VECTOR_BYTES, loop_variables
from metagraph.expr import Var, linear_terms, variables

# Vector instructions per cycle: an AVX-512 core (two 256-bit pipes per kind, as on AMD Zen 4)
ARITHMETIC_PER_CYCLE = 1
LOADS_PER_CYCLE = 1
STORES_PER_CYCLE = 1
ACCUMULATE_LATENCY = 4       # cycles before an accumulator's next update can start
VECTOR_REGISTERS = 32        # accumulators past these (less one for an operand) spill: a load and a
                             # store each per reduction step
CACHE_BYTES = 1 << 20        # a core's last private cache (second level)
SHARED_CACHE_BYTES = 32 << 20    # the cache the cores share (third level)
SHARED_CACHE_BYTES_PER_CYCLE = 32
MEMORY_BYTES_PER_CYCLE = 8


@dataclass
class _Work:
    """Per-iteration issue counts of one loop body (the statements directly in it)."""
    arithmetic: float = 0.0
    loads: float = 0.0
    stores: float = 0.0

    def cycles(self):
        return max(self.arithmetic / ARITHMETIC_PER_CYCLE, self.loads / LOADS_PER_CYCLE,
                   self.stores / STORES_PER_CYCLE)


@dataclass
class Estimate:
    """Cycles of the issue bound and of the memory bound; `cycles` is the larger."""
    issue: float
    memory: float

    @property
    def cycles(self):
        return max(self.issue, self.memory)


def estimate(body, threads=1):
    """The Estimate of a kernel body (its statements) run on `threads` threads."""
    model = _Model(threads)
    return Estimate(model.body(body, vector=None, lanes=1), model.memory(body))


class _Model:
    def __init__(self, threads):
        self.threads = threads

    # ---- issue ----------------------------------------------------------------------------------
    def body(self, statements, vector, lanes):
        """Cycles of one execution of `statements`, inside vectorised loop `vector` (or None)."""
        work, cycles = _Work(), 0.0
        for s in statements:
            if isinstance(s, ir.Loop):
                cycles += self.loop(s, vector, lanes)
            elif isinstance(s, ir.Define):
                work.stores += _vectors(s.size or 1, s.dtype)
            else:
                self.statement(s, work, vector, lanes)
        return cycles + work.cycles()

    def loop(self, loop, vector, lanes):
        if loop.kind == ir.VECTOR:
            inner_lanes = _lanes_of(loop.body)
            return math.ceil(loop.extent / inner_lanes) * self.body(loop.body, loop.var, inner_lanes)
        per_trip = self.body(loop.body, vector, lanes)
        if loop.kind == ir.REDUCE and _accumulates(loop.body):
            spilled = max(0, _accumulator_vectors(loop.body) + 1 - VECTOR_REGISTERS)
            per_trip = max(per_trip + spilled * 2 / LOADS_PER_CYCLE, ACCUMULATE_LATENCY)
        trips = loop.extent
        if loop.kind == ir.PARALLEL:
            trips = math.ceil(loop.extent / max(1, min(self.threads, loop.extent)))
        return trips * per_trip

    def statement(self, s, work, vector, lanes):
        value = getattr(s, "value", None)
        if value is not None:
            self.value(value, work, vector, lanes)
        if isinstance(s, ir.Accumulate):
            work.arithmetic += 0 if _fused(s.value) else 1
        if isinstance(s, (ir.Store, ir.Assign, ir.ScatterAccumulate)):
            index = s.index
            work.stores += 1 if vector is None or _stride(index, vector) in (0, 1) else lanes

    def value(self, value, work, vector, lanes):
        for v in ir.values(value):
            if isinstance(v, ir.Apply):
                work.arithmetic += 1
            elif isinstance(v, ir.Guard):
                work.arithmetic += 1
            elif isinstance(v, ir.Load) or isinstance(v, ir.Ref) and v.index is not None:
                stride = None if vector is None else _stride(v.index, vector)
                if stride is None or stride == 1:
                    work.loads += 1
                elif stride == 0:
                    work.loads += 1 / lanes     # read once around the vectorised loop
                else:
                    work.loads += lanes

    # ---- memory ---------------------------------------------------------------------------------
    def memory(self, body):
        """Cycles the loads of `body` spend moving their parameters into the core's cache."""
        cycles = 0.0
        for load, enclosing in _loads_with_loops(body):
            used = loop_variables(load)
            once = load.dtype.itemsize * math.prod(loop.extent for var, loop in enclosing if var in used)
            again, bandwidth = 1, SHARED_CACHE_BYTES_PER_CYCLE
            for k in range(len(enclosing) - 1, -1, -1):
                var, loop = enclosing[k]
                footprint = self.footprint(loop.body)
                if var not in used and footprint > CACHE_BYTES:
                    again *= loop.extent
                    if footprint > SHARED_CACHE_BYTES:
                        bandwidth = MEMORY_BYTES_PER_CYCLE
            cycles += once / MEMORY_BYTES_PER_CYCLE + (again - 1) * once / bandwidth
        parallel = next((s for s in body if isinstance(s, ir.Loop) and s.kind == ir.PARALLEL), None)
        return cycles / (1 if parallel is None else max(1, min(self.threads, parallel.extent)))

    def footprint(self, body):
        """Bytes the loads inside `body` touch in one execution of it."""
        total = 0
        for load, enclosing in _loads_with_loops(body):
            used = loop_variables(load)
            total += load.dtype.itemsize * math.prod(loop.extent for var, loop in enclosing if var in used)
        return total


def _loads_with_loops(body, enclosing=()):
    """(load of a parameter, the (variable, loop) pairs around it inside `body`) for every load;
    loads of the same element in the same loop body (one operand of a register tile's
    accumulations) once."""
    seen = set()
    for s in body:
        if isinstance(s, ir.Loop):
            yield from _loads_with_loops(s.body, enclosing + ((s.var, s),))
            continue
        value = getattr(s, "value", None)
        for load in ir.loads(value) if value is not None else ():
            if (load.param, load.index) not in seen:
                seen.add((load.param, load.index))
                yield load, enclosing


def _stride(index, var):
    """Elements an index moves per step of `var`; None where it is not linear in it."""
    if index is None:
        return 0
    terms, _ = linear_terms(index)
    stride = 0
    for term, coef in terms.items():
        if term == Var(var):
            stride = coef
        elif var in variables(term):
            return None
    return stride


def _accumulates(statements):
    """Whether an accumulation in `statements` (or in loops inside them other than reductions of
    their own) waits for the one before it, each iteration of the loop around them."""
    return any(isinstance(s, ir.Accumulate) or isinstance(s, ir.Loop) and s.kind != ir.REDUCE and
               _accumulates(s.body) for s in statements)


def _accumulator_vectors(statements):
    """Vector registers the accumulations of one reduction step keep live: one per accumulation
    per trip of the vectorised loops inside it (a register tile's accumulators)."""
    count = 0
    for s in statements:
        if isinstance(s, ir.Accumulate):
            count += 1
        elif isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            trips = math.ceil(s.extent / _lanes_of(s.body)) if s.kind == ir.VECTOR else s.extent
            count += trips * _accumulator_vectors(s.body)
    return count


def _fused(value):
    """Whether an accumulation of `value` is one fused multiply-add (a product)."""
    return isinstance(value, ir.Apply) and value.op == "mul"


def _lanes_of(statements):
    """Lanes of a vector of the widest value type the statements compute."""
    itemsize = 4
    for s in statements:
        value = getattr(s, "value", None)
        if value is not None:
            itemsize = min(itemsize, max(1, value.dtype.itemsize))
    return VECTOR_BYTES // itemsize


def _vectors(size, dtype):
    return math.ceil(size * dtype.itemsize / VECTOR_BYTES)
