"""Lowering: each materialised node and the nodes inlined into it become one kernel.

A kernel is a loop nest over its output; a reduction adds inner loops and an accumulator; a
reduction read only by one element-wise kernel, at its own output position, fuses into that
kernel as its epilogue (conv + bias + relu is one kernel). A reduction to one value per row of
an element-wise kernel, read by nothing else (or by another such reduction), is computed inside
that kernel's loop over rows, before its loop along the row: a row prologue (softmax's max and
sum: one pass over memory instead of three). A `reindex_reduce` is a gather or a scatter
(gather.py).
"""
import copy
import hashlib
import math
from dataclasses import dataclass, field, replace

from metagraph import dtypes
from metagraph.compiler import (blocks, cascade, contraction, decompose, flat_rows, gather, hoist, ir, lanes,
                                peel, rewrites, rows, search)
from metagraph.compiler.fusion import allow_depth, materialised
from metagraph.compiler.generic import (FEW, NOMINAL, batched, generic_form, misread, nominal_applies, same_params,
                                       with_fallback)
from metagraph.compiler.heuristic import ACC_REGISTERS, TILE_FILL, Heuristic
from metagraph.compiler.schedule import Scheduling, applied
from metagraph.compiler.simplify import simplify, substitute
from metagraph.errors import IndexOutOfRange, MetagraphError, at
from metagraph.expr import Binary, Const, Extra, Var, variables
from metagraph.ops.node import reported_op

INDEX_BUDGET = 2000      # expression nodes an index may grow to before its source is materialised


@dataclass
class Step:
    """One kernel launch: its IR (or a library contraction) and which graph positions its
    parameters are."""
    kernel: ir.Kernel        # None once compiled (`compiled`)
    positions: list      # graph position of each kernel parameter (outputs first)
    sites: list          # (error class, message, graph position of the node) per run-time check
    library: object = None   # a contraction.LibraryContraction computed by a library instead
    lowering: tuple = None   # (root, epilogue reductions, row prologues, materialised): `relower`
    tuned_from: str = None   # the heuristic kernel's name, where tuning chose this one instead
    in_place: tuple = ()     # positions of realised inputs read only at the output's own index, by
                             # an element-wise kernel: their buffer may become its output (donation)
    outer: int = None        # the outermost extent, where the kernel takes it at run time (generic.py)
    reduction_schedule: tuple = ()   # the schedule.Rewrite steps applied to the reduction's plain nest
    neighbours: tuple = ()   # step lists near the heuristic's (search.neighbours), when the target asks
    name: str = field(init=False)
    blocked: bool = field(init=False)   # accumulates a block of outputs in a local array

    def __post_init__(self):
        self.name = self.library.name if self.library is not None else self.kernel.name
        self.blocked = self.library is None and (_defines_block(self.kernel.body) or
                                                  _defines_block(self.kernel.fallback[1:]))

    @classmethod
    def restored(cls, name, blocked, **fields):
        """A compiled step read back from disk (pipeline/stored.py), with no IR to derive its name
        and `blocked` from."""
        step = object.__new__(cls)
        step.__dict__.update(kernel=None, name=name, blocked=blocked, **fields)
        return step

    def compiled(self):
        """This step without its IR, once its kernel is compiled: a cached schedule would
        otherwise keep tens of thousands of IR objects alive, which every full collection of
        Python's cycle collector walks (ResNet-18 training: 80 ms every few steps, 36 without)."""
        out = copy.copy(self)
        out.kernel = None
        return out


def _defines_block(statements):
    return any(isinstance(s, ir.Define) and s.size is not None and s.name == "acc" or
               isinstance(s, ir.Loop) and _defines_block(s.body) for s in statements)


@dataclass(frozen=True)
class Target:
    """What the backend offers lowering: the table ops it renders (None: every row; the others
    are decomposed), how many vector registers a register tile may fill, and how many bytes past
    the end of a buffer the schedule allocates its kernels may read, how many threads run its
    kernels, and whether bfloat16 matmuls go to the AVX-512 BF16 host kernel (contraction.py);
    `tile_fill` and `lane_gain` are the thresholds of the channel tile (heuristic.py) and the lane
    rule (lanes.py), `block` the block a reduction tries first (one of heuristic.BLOCKS, None: the
    heuristic's order), and `steps` a reduction's whole schedule (schedule.Rewrite, applied to its
    plain nest instead of the heuristic's); tuning may vary them per kernel, and asks for the
    heuristic's neighbourhood (`search`: search.neighbours, kept on the Step). `l2_bytes`: a core's
    second-level cache, which the heuristic sizes the copies it keeps there by. `shared_sums`: it
    runs an ir.SHARED_SUM loop on threads (rewrites.shared_sums marks them only for such a target)."""
    renders: frozenset = None
    registers: int = ACC_REGISTERS
    slack: int = 0
    threads: int = 1
    bf16_dot: bool = False
    tile_fill: float = TILE_FILL
    lane_gain: float = lanes.LANE_GAIN
    block: str = None
    steps: tuple = None
    search: bool = False
    l2_bytes: int = 1 << 20
    shared_sums: bool = False


class _Refuse(Exception):
    """A fusion that turned out not to apply; the caller materialises `positions` instead."""

    def __init__(self, *positions):
        self.positions = positions


def schedule(graph, target=Target(), library=False, tuned=None, runtime_extents=False):
    """The kernel launches that compute graph's outputs, in order, for `target` (`library`:
    contractions go to a library, see contraction.py; `tuned(kernel name)`: the target that
    timing chose for that kernel instead, or None; see tuning.py; `runtime_extents`: whether the
    code generator takes a kernel's outermost extent at run time, generic.py)."""
    allow_depth()
    kept = Kept(runtime_extents=runtime_extents, batched=batched(graph) if runtime_extents else frozenset())
    chosen, unfusable = materialised(graph, kept.batched), set()
    while True:
        try:
            steps = _steps(graph, chosen, unfusable, target, library, kept)
            break
        except _Refuse as refused:
            for position in refused.positions:
                (unfusable if position in chosen else chosen).add(position)
    choices = [tuned(step.name) if tuned else None for step in steps]
    return [step if choice in (None, target) else _relowered(graph, step, choice, runtime_extents)
            for step, choice in zip(steps, choices)]


def _relowered(graph, step, target, runtime_extents):
    """relower, or `step` itself where the remembered target's steps do not apply to it (a cache
    entry of another version or a damaged one is never trusted)."""
    try:
        return relower(graph, step, target, runtime_extents)
    except ValueError:
        return step


def relower(graph, step, target, runtime_extents=False):
    """The kernel of `step` (a schedule's, for a graph of the same structure as `graph`) for
    another target (other register-tile parameters)."""
    root, epilogue_reduce, prologues, chosen = step.lowering
    nominal = runtime_extents and root in batched(graph)
    other = _lowered(graph, chosen, root, list(epilogue_reduce), target, prologues, runtime_extents, nominal)[1]
    other.lowering, other.tuned_from = step.lowering, step.tuned_from or step.name
    return other


@dataclass
class Kept:
    """What a restart of `schedule` need not redo (`chosen` only grows between restarts): kernels,
    lowered again only if a position their lowering visited has been materialised since
    (ResNet-18's training step restarted enough to lower 19,000 kernels for 500: 22 s), and each
    root's walk for `_readers`."""
    # (root, epilogue, prologues) -> (positions visited, those materialised then, step)
    kernels: dict = field(default_factory=dict)
    walks: dict = field(default_factory=dict)     # root -> (inlined positions, positions read)
    runtime_extents: bool = False     # kernels take their outermost extent at run time
    batched: frozenset = frozenset()  # the positions that carry the data's batch (generic.batched)


def _steps(graph, chosen, unfusable, target, library, kept):
    """The steps for one choice of materialised positions (`kept`: what earlier restarts made)."""
    contractions = {}
    wanted = (dtypes.float32, dtypes.float64) * bool(library) + (dtypes.bfloat16,) * target.bf16_dot
    for k in sorted(chosen) if wanted else ():
        try:
            found = contraction.find(graph, chosen, k, wanted)
        except contraction.NotMaterialised as missing:
            raise _Refuse(missing.position) from None
        if found is not None:
            contractions[k] = found
    readers = _readers(graph, chosen, kept.walks)
    fusable = {k for k in chosen - unfusable - set(contractions)
               if graph.nodes[k].op == "reduce" and k not in graph.outputs}
    fused = {}
    for k in sorted(fusable):
        if len(readers.get(k, ())) == 1:
            (reader,) = readers[k]
            if graph.nodes[reader].op not in rows.NOT_ELEMENTWISE and \
                    graph.nodes[reader].shape == graph.nodes[k].shape:
                fused[k] = reader
    prologue = rows.choose(graph, fusable - set(fused), readers, set(fused.values()) | set(contractions))
    steps, frozen = [], frozenset(chosen)
    for k in sorted(chosen):
        if k in fused or k in prologue:
            continue
        if k in contractions:
            spec, operands = contractions[k]
            steps.append(Step(None, [k] + operands, [], spec))
            continue
        epilogue_reduce = [r for r, reader in fused.items() if reader == k]
        if len(epilogue_reduce) > 1:          # at most one reduction per kernel: refuse the rest at
            raise _Refuse(*epilogue_reduce[1:])   # once (one restart each made a sum of n norms n^2)
        prologues = frozenset(r for r, root in prologue.items() if root == k)
        key = (k, tuple(epilogue_reduce), prologues)
        if key in kept.kernels and frozenset(kept.kernels[key][0] & frozen) == kept.kernels[key][1]:
            steps.append(kept.kernels[key][2])
            continue
        lowering, step = _lowered(graph, frozen, k, epilogue_reduce, target, prologues, kept.runtime_extents,
                                  k in kept.batched)
        step.lowering = (k, tuple(epilogue_reduce), prologues, frozen)
        kept.kernels[key] = (lowering.visited, frozenset(lowering.visited & frozen), step)
        steps.append(step)
    return steps


def _readers(graph, chosen, walks):
    """For each materialised position: the kernels (by root position) that read it. `walks` keeps
    each root's walk across the restarts of `schedule`, where `chosen` only grows: a walk is redone
    only when a position it went through inline has been materialised since."""
    readers = {}
    for root in chosen:
        walk = walks.get(root)
        if walk is None or not walk[0].isdisjoint(chosen):
            walk = walks[root] = _walk(graph, chosen, root)
        for k in walk[1]:
            readers.setdefault(k, set()).add(root)
    return readers


def _walk(graph, chosen, root):
    """(positions the kernel of `root` inlines, positions it reads from buffers)."""
    seen, reads, stack = set(), set(), [graph.nodes[root]]
    while stack:
        node = stack.pop()
        for source in node.inputs:
            k = graph.position[source.id]
            if k in chosen or source.buffer is not None:
                reads.add(k)
            elif k not in seen:
                seen.add(k)
                stack.append(source)
    return seen, reads


_INIT = {"add": lambda dtype: 0, "mul": lambda dtype: 1, "max": dtypes.min_value}


def _strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _and(a, b):
    """a && b, where None and the constant 1 stand for 'always true'."""
    if a is None or a == Const(1):
        return b
    if b is None or b == Const(1):
        return a
    return Binary("&&", a, b)


def _size(expr):
    if isinstance(expr, (Var, Const)):
        return 1
    if isinstance(expr, Binary):
        return 1 + _size(expr.a) + _size(expr.b)
    if isinstance(expr, Extra):
        return 1 + sum(_size(a) for a in expr.args)
    return 1 + _size(expr.cond) + _size(expr.a) + _size(expr.b)


def _lowered(graph, chosen, root, epilogue_reduce, target, prologues, runtime_extents, batch):
    """(the lowering, its step) of one kernel: scheduled for NOMINAL rows where its output's first
    extent may be taken at run time and the kernel then serves every extent (generic.py), else for
    the extent."""
    if runtime_extents and batch and nominal_applies(graph.nodes[root]):
        lowering = _Lowering(graph, chosen, root, epilogue_reduce, target, prologues, True, nominal=NOMINAL)
        step = lowering.kernel()
        if step is None and lowering.misread:      # a weight with as many rows as the batch, say
            exclude = frozenset(graph.nodes[k].id for k in lowering.misread)
            lowering = _Lowering(graph, chosen, root, epilogue_reduce, target, prologues, True, nominal=NOMINAL,
                                 exclude=exclude)
            step = lowering.kernel()
        if step is not None and lowering.least > 1:    # and a body for fewer rows than its groups'
            whole = _Lowering(graph, chosen, root, epilogue_reduce, target, prologues, True, nominal=FEW,
                              whole_first=True, exclude=lowering.exclude)
            fallback = whole.kernel()
            if fallback is not None and whole.least == 1 and fallback.sites == step.sites and \
                    fallback.positions == step.positions and fallback.in_place == step.in_place and \
                    same_params(fallback.kernel, step.kernel):
                step = replace(step, kernel=with_fallback(step.kernel, fallback.kernel, lowering.least))
            elif lowering.least > graph.nodes[root].shape[0]:
                step = None
        if step is not None:
            return lowering, step
    lowering = _Lowering(graph, chosen, root, epilogue_reduce, target, prologues, runtime_extents)
    return lowering, lowering.kernel()


class _Lowering:
    def __init__(self, graph, chosen, root, epilogue_reduce, target, prologues=frozenset(), runtime_extents=False,
                 nominal=None, whole_first=False, exclude=frozenset()):
        self.graph, self.chosen, self.root, self.target = graph, chosen, root, target
        self.whole_first, self.least, self.exclude, self.misread = whole_first, None, exclude, set()
        self.runtime_extents = runtime_extents
        self.nominal = nominal          # rows scheduled for whatever the batch (NOMINAL, FEW), or None
        self.first = graph.nodes[root].shape[0] if nominal else None
        self.nominal_params = set()     # parameters whose first extent NOMINAL stands for
        self.fused_reduce = epilogue_reduce[0] if epilogue_reduce else None
        self.prologue_reduces, self.building = prologues, []
        self.prologue_depths = {}    # a row prologue's accumulator name -> (depth, graph position)
        self.prologue_positions = set()     # the graph positions of the row prologues made
        self.prologues = []      # rows.Prologue, in the order made
        self.params, self.param_of, self.sites, self.memo = [], {}, [], {}
        self.extents, self.accumulator = {}, None
        self.reduce_parts = None
        self.visited = set()     # positions whose being in `chosen` decided what was built
        self.outer, self.outer_shape = None, None    # the output's own index, (shape, dtype)
        self.identical_reads = {}    # realised input position -> read only at `outer` so far
        self.steps = None        # the heuristic's schedule of the reduction (schedule.Rewrite), if any
        self.neighbours = ()     # step lists near it (Target.search)

    # ---- parameters ------------------------------------------------------------------------
    def param(self, position, output=False):
        if position not in self.param_of:
            node = self.graph.nodes[position]
            self.param_of[position] = len(self.params)
            shape = self.seen(node)
            if shape is not node.shape:
                self.nominal_params.add(len(self.params))
            self.params.append((position, ir.Param(f"p{len(self.params)}", node.dtype, shape, output)))
        return self.param_of[position]

    def seen(self, node):
        """A node's shape as this lowering schedules for it: NOMINAL first where its first extent is
        the output's, when lowering for NOMINAL rows, unless a lowering before this one found it
        read otherwise than along the output's first dimension (`exclude`; checked: generic.py)."""
        shape = node.shape
        if self.first is not None and shape and shape[0] == self.first and node.id not in self.exclude:
            return (self.nominal,) + tuple(shape[1:])
        return shape

    def site(self, kind, message, node):
        """A run-time check: its number is what a kernel writes to `err` when the check fails."""
        self.sites.append((kind, f"{reported_op(node)}: {message}", self.graph.position[node.id]))
        return len(self.sites)

    def flat(self, shape, index):
        offset = Const(0)
        for expr, size, stride in zip(index, shape, _strides(shape)):
            if size != 1:
                offset = offset + expr * stride
        return simplify(offset, self.extents)

    # ---- values ----------------------------------------------------------------------------
    def value(self, node, index, valid):
        key = (node.id, index, valid)
        if key not in self.memo:
            self.memo[key] = self._value(node, index, valid)
        elif self.building:
            self.reachable(self.memo[key])
        return self.memo[key]

    def reachable(self, value):
        """Refuse a value made earlier that reads a row prologue computed deeper in the loops than
        the prologue being built now can see (softmax(a @ b): the matmul's per-element sum, made
        for the numerator, read again by the row's max over the same elements)."""
        for v in ir.values(value):
            if isinstance(v, ir.Ref) and v.name in self.prologue_depths:
                depth, position = self.prologue_depths[v.name]
                if depth > min(self.building):
                    raise _Refuse(position)

    def _value(self, node, index, valid):
        k = self.graph.position[node.id]
        self.visited.add(k)
        if k == self.fused_reduce:
            return self.reduction(node, index)
        if k in self.prologue_reduces:
            return self.row_prologue(node, index, valid)
        if node.op == "const":
            return ir.Scalar(node.attrs["value"], node.dtype)
        if node.buffer is not None or (k in self.chosen and k != self.root):
            if node.buffer is not None:
                identical = valid is None and index == self.outer and \
                    (node.shape, node.dtype) == self.outer_shape
                self.identical_reads[k] = self.identical_reads.get(k, True) and identical
            return ir.Load(self.param(k), self.flat(self.seen(node), index), node.dtype, valid)
        if node.op == "index":
            return decompose.index_value(index[node.attrs["axis"]], node.dtype)
        if node.op == "reindex":
            return self.reindex(node, index, valid)
        if node.op == "reduce":
            return self.reduction(node, index)
        if node.op == "contiguous":
            return self.value(node.inputs[0], index, valid)
        if node.op == "buffer":         # its buffer was given to a later value (runtime/donation.py)
            raise MetagraphError(f"the value created at {at(node.location)} was overwritten in place by "
                                 "a later step; compute what reads it before that step")
        args = tuple(self.value(source, index, valid) for source in node.inputs)
        site = self.site(MetagraphError, "integer division by zero", node) if node.op in ("idiv", "mod") \
            else None
        return decompose.apply(node.op, args, node.dtype, site, self.target.renders)

    def extras(self, node, expr):
        """Index expression with Extra(k) renumbered to the kernel parameter of extra k."""
        if isinstance(expr, Extra):
            extra = node.inputs[1 + expr.index]
            args = tuple(self.extras(node, a) for a in expr.args)
            param = self.param(self.graph.position[extra.id])
            return Extra(param, tuple(simplify(a, self.extents) for a in args))
        if isinstance(expr, Binary):
            return Binary(expr.op, self.extras(node, expr.a), self.extras(node, expr.b))
        if hasattr(expr, "cond"):
            return type(expr)(*(self.extras(node, part) for part in (expr.cond, expr.a, expr.b)))
        return expr

    def inside(self, index, shape):
        """The condition that every index lies in its dimension (None where the ranges prove it)."""
        condition = None
        for expr, size in zip(index, shape):
            condition = _and(condition, simplify(Binary("&&", Binary("<=", Const(0), expr),
                                                        Binary("<", expr, Const(size))), self.extents))
        return None if condition is None or condition == Const(1) else condition

    def reindex(self, node, index, valid):
        source = node.inputs[0]
        mapped = tuple(simplify(substitute(self.extras(node, e), index), self.extents)
                       for e in node.attrs["index_map"])
        if any(_size(e) > INDEX_BUDGET for e in mapped):
            raise _Refuse(self.graph.position[source.id])
        shape = self.seen(source)
        inside = self.inside(mapped, shape)
        if inside is not None and shape is not source.shape:   # read past NOMINAL rows: not a batch's
            self.misread.add(self.graph.position[source.id])
        inner = self.value(source, mapped, _and(valid, inside))
        if inside is None:
            return inner
        if not node.attrs["checked"] and node.attrs["fill"] == 0 and isinstance(inner, ir.Load):
            return inner        # the load reads nothing and gives 0 wherever the index is outside
        check = self.site(IndexOutOfRange, f"index out of bounds for shape {source.shape}", node) \
            if node.attrs["checked"] else None
        return ir.Guard(inside, inner, node.attrs["fill"], valid, check)

    def reduction(self, node, index):
        """The fused reduction: an accumulator filled by inner loops (one per kernel)."""
        if self.accumulator is not None:
            raise _Refuse(self.graph.position[node.id])
        root = self.graph.nodes[self.root]
        identity = tuple(Var(d) if size != 1 else index[d] for d, size in enumerate(node.shape))
        if node.shape != root.shape or tuple(index) != identity:
            raise _Refuse(self.graph.position[node.id])
        source_index, loops = self.reduced(node, index, root.ndim)
        op = node.attrs["op"]
        value = self.value(node.inputs[0], source_index, None)
        return self.accumulate(node.dtype, _INIT[op](node.dtype), op, loops, value)

    def reduced(self, node, index, first_var):
        """(the index into a reduce node's input at output `index`, the loops over its reduced
        axes): loop variables from `first_var` on."""
        source_index, loops, out_dim, var = [], [], 0, first_var
        for d, size in enumerate(node.inputs[0].shape):
            if d in node.attrs["axes"]:
                source_index.append(Var(var))
                self.extents[var] = size
                loops.append((var, size))
                var += 1
                out_dim += node.attrs["keepdim"]
            else:
                source_index.append(index[out_dim])
                out_dim += 1
        return tuple(source_index), loops

    def row_prologue(self, node, index, valid):
        """A reduction computed once per row of this element-wise kernel (rows.py): inside its
        loops over the variables `index` reads (the first `depth`), before the loops after them;
        with those loops' own variables when it reduces over exactly their extents. Its value is
        its accumulator, which the kernel reads instead of a buffer."""
        position, root = self.graph.position[node.id], self.graph.nodes[self.root]
        used = set().union(*(variables(e) for e in index))
        depth = 1 + max(used, default=-1)
        # named by its order in the kernel, not its graph position: the same kernel in a graph
        # numbered otherwise is then the same code (compiler/generic.py compares kernels' forms)
        name = f"row{len(self.prologue_depths)}"
        axes = node.attrs["axes"]
        reduced = tuple(size for d, size in enumerate(node.inputs[0].shape) if d in axes)
        if valid is not None or not used or depth > min([root.ndim] + self.building) or \
                position in self.prologue_positions or node.numel != math.prod(root.shape[:depth]) or \
                depth == root.ndim and math.prod(reduced) > rows.PER_ELEMENT_TERMS:
            # read conditionally, not once per row, at two places, (inside another prologue) per
            # element of that prologue's row, or a long reduction per element (rows.py)
            raise _Refuse(position)
        self.prologue_depths[name] = (depth, position)
        self.prologue_positions.add(position)
        aligned = bool(reduced) and reduced == root.shape[depth:]
        source_index, loops = self.reduced(node, index, depth if aligned else 1 + max(self.extents))
        op = node.attrs["op"]
        acc_dtype = dtypes.computed_in(node.dtype)
        self.building.append(depth)
        accumulate = ir.Accumulate(name, op, decompose.widen(self.value(node.inputs[0], source_index, None)))
        self.building.pop()
        body = [accumulate]
        for var, size in reversed(loops):
            body = [ir.Loop(var, size, ir.REDUCE, body)]
        define = ir.Define(name, acc_dtype, _INIT[op](node.dtype), op)
        self.prologues.append(rows.Prologue(depth, [define] + body, accumulate, aligned))
        result = ir.Ref(name, acc_dtype)
        return result if acc_dtype == node.dtype else ir.Apply("cast", (result,), node.dtype)

    def accumulate(self, dtype, init, op, loops, value):
        """The kernel's accumulator for a reduction of `value` over `loops`, and its value as
        `dtype` (float16 and bfloat16 accumulate in float32)."""
        acc_dtype = dtypes.computed_in(dtype)
        self.accumulator = ir.Ref("acc", acc_dtype)
        self.reduce_parts = (acc_dtype, init, op, loops, decompose.widen(value))
        if acc_dtype != dtype:
            return ir.Apply("cast", (self.accumulator,), dtype)
        return self.accumulator

    # ---- kernels ---------------------------------------------------------------------------
    def kernel(self):
        node = self.graph.nodes[self.root]
        out = self.param(self.root, output=True)
        gathered = gather.gathered(self, node, out) if node.op == "reindex_reduce" and node.numel else None
        if not node.numel:          # nothing to compute: an empty kernel, which the executor never launches
            body, kind = [], "e"
        elif gathered is not None:
            body, kind = gathered, "g"
        elif node.op == "reindex_reduce":
            body, kind = gather.scatter(self, node, out), "s"
        else:
            shape = self.seen(node)
            for d, size in enumerate(shape):
                self.extents[d] = size
            outer = self.outer = tuple(Var(d) for d in range(node.ndim))
            self.outer_shape = (node.shape, node.dtype)
            store = ir.Store(out, self.flat(shape, outer), self.value(node, outer, None))
            rows.cache_shared(self.prologues, store, shape, self.extents)
            body = rows.place(self.loop_nest(node, store), self.prologues)
            kind = "r" if self.reduce_parts else "e"
        body = cascade.blocked_sums(body, self.extents)
        params = [param for _, param in self.params]
        body = rewrites.scheduled(body, self.extents, params, self.target.threads)
        body = lanes.lanes_along_reductions(body, self.extents, self.target.lane_gain)
        body = peel.peeled(body, self.extents)
        body = flat_rows.flattened(body, self.extents, params)
        positions = [position for position, _ in self.params]
        element_wise = kind == "e" and not self.prologues and not _defines_block(body)
        in_place = tuple(k for k, identical in self.identical_reads.items() if identical and element_wise)
        if in_place:
            shared = {self.root, *in_place}
            params = [replace(param, shared=True) if k in shared else param for k, param in self.params]
        body = hoist.hoisted(body, params)
        if self.target.shared_sums:
            body = rewrites.shared_sums(body, self.target.threads)
        kernel, outer = ir.Kernel(None, params, body, dict(self.extents)), None
        form = None
        if self.runtime_extents and kind in ("e", "r"):
            form = generic_form(kernel, kind, node.shape, self.nominal and (self.nominal, self.nominal_params))
        if self.nominal and form is None:       # lowered again, for its extent or seeing fewer
            self.misread |= {self.params[k][0] for k in misread(kernel, self.nominal_params)}
            return None
        if form is not None:        # (named by its form: described once, not also as it is)
            (kernel, self.least), outer = form, node.shape[0]
        else:
            shape = "x".join(map(str, node.shape)) or "scalar"
            kernel.name = f"{kind}_{shape}_{hashlib.sha1(ir.describe((body, params)).encode()).hexdigest()[:8]}"
        return Step(kernel, positions, self.sites, in_place=in_place, outer=outer,
                    reduction_schedule=tuple(self.steps or ()), neighbours=tuple(self.neighbours))

    def loop_nest(self, node, store):
        """Loops over the output around `store`, the first the parallel one; a reduction's plain
        nest (blocks.plain_nest) scheduled by the target's steps for this kernel where tuning chose
        them, else by the heuristic (heuristic.py)."""
        if self.reduce_parts is None:
            body = [store]
            for d in reversed(range(node.ndim)):
                body = [ir.Loop(d, self.extents[d], ir.PARALLEL if d == 0 else ir.SERIAL, body)]
            return body
        acc_dtype, init, op, loops, value = self.reduce_parts
        body = blocks.plain_nest(self.seen(node), self.extents, ir.Define("acc", acc_dtype, init, op), loops,
                                 ir.Accumulate("acc", op, value), store)
        plain = (body, dict(self.extents))
        if self.target.steps is not None:
            self.steps = self.target.steps
            body = applied(body, self.extents, self.target.steps)
        else:
            scheduling = Scheduling(body, self.extents)
            target = self.target
            Heuristic(scheduling, self.seen(node), acc_dtype.itemsize, target.registers, target.tile_fill,
                      self.readable() if target.slack else None, target.block, target.l2_bytes,
                      self.whole_first).schedule()
            self.steps, body = scheduling.steps, scheduling.body
        if self.target.search:
            self.neighbours = search.neighbours(*plain, self.steps)
        return body

    def readable(self):
        """Elements of each parameter (by number) a load may touch: a buffer this schedule
        allocates has `slack` bytes past its end; one that existed before (a user's array) has
        none. A list, not a method the nest calls back: the nest's IR outlives this lowering in
        reference cycles, and must not keep the graph (and the buffers of its nodes) alive."""
        nodes = [self.graph.nodes[position] for position, _ in self.params]
        return [math.prod(self.seen(node)) + (self.target.slack // node.dtype.itemsize if node.buffer is None else 0)
                for node in nodes]
