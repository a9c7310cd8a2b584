"""Replay: a schedule that has run before is launched again from a plan made once, in one native call.

executor.run decides everything as it goes: per kernel it allocates the output from the pool,
builds the cffi argument array of every parameter, checks the error word, walks donation and
release rules. For a ResNet-18 training step (559 launches) that was about 10 ms of Python per
step, around 100 ms of kernels. Almost none of it depends on the data, so a Replay keeps, per
schedule:
- what every run shares: the kernels' addresses, a slot per value the steps read or compute, which
  slots each launch is given, which inputs each step may take over (donation.Plan);
- per *decision* (which donations were allowed, which values autograd would keep go back to the
  pool: what a run decides from reference counts, before any kernel runs, since no launch changes
  them), a buffer plan (buffer_plan.Layout): where each value lives, decided from the lifetimes.
A run then costs the decision pass, a pool allocation per array of its plan, one address per
realised input, and one call of a small C loop (`LOOP_SOURCE`, built once by the system C
compiler and kept in the kernel cache) that fills each kernel's argument array from the slots and
calls the kernels in order, stopping at the first failed check. A step whose launch is not a
native function (a library contraction through numpy) runs from Python between native stretches.

Used by pipeline/realize.py from a schedule's third run (its second is tuning's) when nothing
needs each kernel seen from Python: no profile (which times each kernel), no METAGRAPH_DEBUG or
METAGRAPH_CHECK, host memory (a device's buffers are not C pointers: runtime/opencl.py). Without a
C compiler, schedules run through executor.run as before.

A schedule whose runs decide nothing, launch nothing from Python and keep one array (`plain`: an
eager call such as `(a @ b).numpy()`) also runs without its graph (`run_plain`), from its realised
inputs' nodes; the C extension `_launch` (_launch.c) then fills the slots and calls the loop.
"""
import threading
import warnings
import weakref
from operator import attrgetter
from sys import getrefcount

import cffi
import numpy as np

from metagraph import flags
from metagraph.errors import CompileError, OutOfMemory
from metagraph.extensions import load
from metagraph.ops.scalars import Realisations
from metagraph.runtime import buffer_plan, donation, executor, pool

_launch = load("metagraph.runtime._launch", 2, "plain runs fill their slots in Python")

ENABLED = True          # pipeline/realize.py replays; tests turn it off to compare with executor.run
LAYOUTS_KEPT = 8        # buffer plans a schedule keeps (one per decision seen; a loop sees one or two)
_FLAGS = attrgetter("requires_grad", "leaf", "released")     # what Donations._final reads of a node
_REQUIRES_GRAD = attrgetter("requires_grad")

LOOP_SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef void (*metagraph_kernel)(char **, int64_t *);

/* What a buffer plan's runs share (one per runtime/buffer_plan.Layout): step i's arguments are
   slots[arg_slot[arg_start[i] .. arg_start[i + 1])]; its output has its slack zeroed first
   (slack_at: where it begins), since its memory held other values before or came from malloc
   uninitialised; `count` slots precede the error word. */
typedef struct {
    metagraph_kernel *kernels;
    const int64_t *arg_start, *arg_slot, *slack_at;
    int64_t count, slack;
} metagraph_plan;

/* Launch steps [first, last). `slots` holds the plan's `count` addresses, then the error word,
   then room for the arguments of a step. A step without a kernel (an empty output) is skipped.
   Returns the step whose check failed (its number is in the error word), or last. */
int64_t metagraph_replay(int64_t first, int64_t last, const metagraph_plan *plan, char **slots)
{
    int64_t *error = (int64_t *)(slots + plan->count);
    char **args = slots + plan->count + 1;
    const int64_t *arg_start = plan->arg_start, *arg_slot = plan->arg_slot;
    for (int64_t i = first; i < last; i++) {
        if (!plan->kernels[i])
            continue;
        for (int64_t a = arg_start[i], j = 0; a < arg_start[i + 1]; a++, j++)
            args[j] = slots[arg_slot[a]];
        memset(args[0] + plan->slack_at[i], 0, (size_t)plan->slack);
        plan->kernels[i](args, error);
        if (*error)
            return i;
    }
    return last;
}

/* Point each arena value's slot at its place in the arena. */
void metagraph_place(char **slots, const int64_t *slot, const int64_t *offset, int64_t count, char *base)
{
    for (int64_t j = 0; j < count; j++)
        slots[slot[j]] = base + offset[j];
}
"""

_DECLARATIONS = """
typedef void (*metagraph_kernel)(char **, int64_t *);
typedef struct {
    metagraph_kernel *kernels;
    const int64_t *arg_start, *arg_slot, *slack_at;
    int64_t count, slack;
} metagraph_plan;
int64_t metagraph_replay(int64_t first, int64_t last, const metagraph_plan *plan, char **slots);
void metagraph_place(char **slots, const int64_t *slot, const int64_t *offset, int64_t count, char *base);
"""

_loop = None            # (ffi, library) once built; False when it cannot be
_loop_lock = threading.Lock()


def native_loop():
    """(ffi, library) of the replay loop, compiled on first use (kept in the kernel cache with the
    C kernels' toolchain identity), or None when no C compiler can build it (a warning says so)."""
    global _loop
    if _loop is None:
        with _loop_lock:
            if _loop is None:
                _loop = _built() or False
    return _loop or None


def _built():
    from metagraph.codegen.toolchain import compile_shared, toolchain_identity  # (codegen imports runtime)
    from metagraph.runtime.cache import KernelCache
    try:
        cache = KernelCache(flags.CACHE_DIR, "replay\n" + toolchain_identity())
        key = cache.key(LOOP_SOURCE)
        path = cache.find(key) or cache.build(LOOP_SOURCE, [key], compile_shared)[0]
    except (CompileError, OSError) as error:
        warnings.warn(f"metagraph: no native replay loop ({error}); schedules launch each kernel "
                      f"from Python", stacklevel=3)
        return None
    ffi = cffi.FFI()
    ffi.cdef(_DECLARATIONS)
    return ffi, ffi.dlopen(path)


def usable(functions):
    """Whether a schedule with these launch callables can be replayed: the native loop exists and
    at least one of them is a native function (codegen/compiled.py's launcher gives `address`)."""
    return any(getattr(f, "address", None) for f in functions) and native_loop() is not None


class Replay:
    """What every run of one schedule shares (see the module's docstring); `run` is a run."""

    def __init__(self, graph, steps, functions, plan, dead, reads):
        """`plan`: the schedule's donation.Plan; `dead`: executor.dead_after(steps, ...); `reads`:
        executor.external_reads(steps, ...)."""
        self.ffi, self.library = native_loop()
        self.loop_address = int(self.ffi.cast("uintptr_t", self.library.metagraph_replay))
        self.slot_type = self.ffi.typeof("char *[]")
        nodes = graph.nodes
        self.steps, self.functions, self.plan, self.reads = steps, functions, plan, reads
        self.outputs_of = [step.positions[0] for step in steps]
        self.last = executor.last_uses(steps)
        self.values = {}        # computed position -> (shape, numpy dtype, nbytes)
        for position in self.outputs_of:
            node = nodes[position]
            dtype = node.dtype.np
            self.values[position] = (node.shape, dtype, int(np.prod(node.shape)) * np.dtype(dtype).itemsize)
        self.base_slots = {k: slot for slot, k in enumerate(list(reads) + self.outputs_of)}
        read_set = set(reads)
        # the donations a replay makes: of realised inputs only (the buffer plan lets a computed value
        # that dies share its memory with later ones)
        self.donor_steps = [(i, [k for k in ks if k in read_set]) for i, ks in enumerate(plan.donors)]
        self.donor_steps = [(i, ks) for i, ks in self.donor_steps if ks]
        self.dead = sorted((p for positions in dead for p in positions), key=self.base_slots.get)
        empty = [self.values[p][2] == 0 for p in self.outputs_of]
        addresses = [None if gone else getattr(f, "address", None) for f, gone in zip(functions, empty)]
        self.kernels = self.ffi.new("metagraph_kernel[]", [self.ffi.cast("metagraph_kernel", a or 0)
                                                           for a in addresses])
        self.python_steps = {i for i, (address, gone) in enumerate(zip(addresses, empty))
                             if address is None and not gone}      # launched from Python
        self.max_args = max((len(step.positions) + 1 for step in steps), default=1)
        # kernels taking their outer extent at run time (compiler/generic.py): a slot each after the
        # values', pointing at its extent, which no run changes
        outer = [(i, step.outer) for i, step in enumerate(steps) if step.outer is not None]
        self.outer_values = np.array([extent for _, extent in outer], np.int64)
        self.outer_slots = {i: len(self.base_slots) + j for j, (i, _) in enumerate(outer)}
        self.layouts = {}       # decision -> Layout
        self.realised = [k for k, node in enumerate(nodes) if node.buffer is not None and node.op != "const"]
        self.flagged = sorted(set(self.outputs_of) | set(graph.outputs))
        # whether a run decides anything (_decide): donations, or values that die and that autograd
        # might keep (requires_grad is not in the key, so that is asked at every run)
        self.decides = bool(self.donor_steps or self.dead)
        self.all_dropped = (True,) * len(self.dead)
        self.memo = None        # (fingerprint, {position: Donations.unshared}) of the last walks
        self.laid = {}          # input position -> weak reference to the array last found laid out

    def run(self, graph, explain=None):
        """One run, as executor.run(graph, steps, ..., dead, donations, reads=...) would do it;
        returns the arrays of the values the run keeps (outputs, values autograd keeps) and of its
        realised inputs, by graph position."""
        Realisations.count += 1
        nodes = graph.nodes
        buffers = {k: nodes[k].buffer for k in self.reads}
        decision = self._decide(graph, buffers) if self.decides else ()
        layout = self.layouts.get(decision)
        if layout is None:
            layout = buffer_plan.Layout(self, decision)
            if len(self.layouts) >= LAYOUTS_KEPT:
                self.layouts = {}               # (replaced, not cleared: other threads may read it)
            self.layouts[decision] = layout
        ffi, library = self.ffi, self.library
        from_buffer, plan = ffi.from_buffer, layout.plan
        slots, slots_address = layout.slots()
        arena, allocated, finished = None, [], 0
        try:
            for slot, k in layout.read_slots:
                slots[slot] = from_buffer(buffers[k])
            take, slack, allocations = executor.POOL.take, executor.SLACK_BYTES, layout.allocations
            arena = self._arena(layout, slots)
            for first, last, taken in layout.segments:
                for shared, shape, dtype, keeper, zero_tail in allocations[len(allocated):taken]:
                    try:        # (taken as executor.run takes it: when its first value is computed)
                        array = take(shape, dtype, slack, zero_tail)
                    except OutOfMemory as error:
                        raise executor.for_node(error, nodes[layout.first_value[len(allocated)]]) from None
                    allocated.append(array)
                    address = from_buffer(array)
                    for slot in shared:
                        slots[slot] = address
                    if keeper is not None:
                        buffers[keeper] = array
                if last is None:            # a step launched from Python
                    error = np.zeros(1, np.int64)
                    arrays = [layout.array(p, buffers, arena, allocated) for p in self.steps[first].positions]
                    if self.steps[first].outer is not None:
                        arrays.append(executor.outer_argument(self.steps[first].outer))
                    layout.zero_slack(self.outputs_of[first], arena)
                    self.functions[first](arrays, error)
                    site = int(error[0])
                    finished = first if site else first + 1
                else:
                    finished = library.metagraph_replay(first, last, plan, slots)
                    site = 0 if finished == last else int(ffi.cast("int64_t", slots[layout.slot_count]))
                if site:
                    self._fail(graph, finished, site, layout, (buffers, arena, allocated), explain)
        except BaseException:
            if layout.donated:          # what the finished steps computed must not need a donor
                self._keep_finished(graph, layout, (buffers, arena, allocated), finished)
            raise
        layout.spare.append((slots, slots_address))      # (a failed run's slots are not used again)
        for donor, kept in layout.moves:
            array = buffers.pop(donor)
            if kept is not None:
                buffers[kept] = array
        return buffers

    def _arena(self, layout, slots):
        """A run's arena, taken from the pool, with the slots of the values placed in it pointed at
        their places; None for a layout without one."""
        if not layout.arena_bytes:
            return None
        arena = executor.POOL.take((layout.arena_bytes,), np.uint8)
        self.library.metagraph_place(slots, layout.arena_slots, layout.arena_offsets, len(layout.offsets),
                                     self.ffi.from_buffer(arena))
        return arena

    def plain(self, graph):
        """The Layout of a run of this schedule that needs no graph (`run_plain`): one that gives no
        input away and drops every value that dies, when no step is launched from Python, no value
        that dies is one autograd would keep (so nothing else is decided: `_decide`) and the run
        keeps one array beside the arena, its output's. Giving no input away is always right; a
        run through `run` may give one away where nothing else refers to it (an eager call's
        arguments are most often the user's). None for any other schedule."""
        nodes = graph.nodes
        if self.python_steps or any(nodes[p].requires_grad for p in self.dead):
            return None
        decision = (None,) * len(self.donor_steps) + self.all_dropped
        layout = self.layouts.get(decision)
        if layout is None:
            layout = self.layouts[decision] = buffer_plan.Layout(self, decision)
        (output,) = graph.outputs
        if layout.moves or [keeper for _, _, _, keeper, _ in layout.allocations] != [output]:
            return None
        layout.reusable = self.values[output][2] + executor.SLACK_BYTES < pool.POOLED_MIN
        return layout

    def run_plain(self, layout, nodes, reads):
        """A run through `layout` (from `plain`) given its realised inputs, nodes[k] for k in `reads`
        (in the order of layout.read_slots): the output's array, or None when an allocation or a
        check failed or an input has no value (then nothing is kept, and a run through `run` does
        what it does). The output's array is taken before the first kernel rather than its own (one
        native stretch): the arena is held for the whole run anyway, so the run's peak is the same.
        The slots are filled and the loop called by the C extension `_launch` where it is built.

        An output array below the pool's size is kept by the layout and taken again by its next run
        if nothing else refers to it or its memory by then (the value was dropped): an eager call
        in a loop then allocates nothing (malloc is quick, numpy's wrapping of its bytes is not:
        0.4 of a 64^3 matmul's 6.7 us, and the memory is warm). One still referred to is forgotten."""
        Realisations.count += 1
        take, from_buffer = executor.POOL.take, self.ffi.from_buffer
        slots, address = layout.slots()
        (shared, shape, dtype, _, zero_tail), = layout.allocations
        array = None
        if layout.returned:
            try:
                array = layout.returned.pop()     # (another thread may have taken it)
            except IndexError:
                pass
            # nothing else may refer to the array (this name and the call's argument do) nor to the
            # bytes under it (the array does): numpy's views name the owner of the memory as their base
            if array is not None and (getrefcount(array) > 2 or getrefcount(array.base) > 2):
                array = None
        try:
            arena = self._arena(layout, slots)
            if array is None:
                array = take(shape, dtype, executor.SLACK_BYTES, zero_tail)
        except OutOfMemory:
            return None
        count = len(self.steps)
        if _launch is not None:
            stopped = _launch.run(self.loop_address, layout.plan_address, address, layout.slot_length, count,
                                  layout.read_numbers + shared, nodes, reads, (array,) * len(shared))
        else:
            buffers = [nodes[k].buffer for k in reads]
            if any(buffer is None for buffer in buffers):
                stopped = -1
            else:
                for slot, buffer in zip(layout.read_numbers, buffers):
                    slots[slot] = from_buffer(buffer)
                for slot in shared:
                    slots[slot] = from_buffer(array)
                stopped = self.library.metagraph_replay(0, count, layout.plan, slots)
        del arena           # (held until the loop has run)
        if stopped == count or stopped < 0:     # (a run that stopped at a check set its error word)
            layout.spare.append((slots, address))
        if stopped != count:
            return None
        if layout.reusable:
            layout.returned.append(array)
        return array

    def _decide(self, graph, buffers):
        """What this run decides before any kernel runs, as executor.run would as it goes: per
        donating step, the input it writes over (or None; that input's node drops its buffer),
        then per value that dies in the run, whether it goes back to the pool (one autograd would
        keep unless nothing outside the graph can reach it: Donations.unshared).

        The reachability walks depend only on the graph's structure (the key), the reference
        counts of its nodes, the autograd flags of the nodes the walks may stop at and what its
        realised nodes were computed from; all of these are compared in one pass with the last
        run's, and when they are equal the last run's answers stand. Whether each input's array
        is free to take is checked every run (its reference counts; its layout once per array)."""
        nodes, position = graph.nodes, graph.position
        if not self.donor_steps and not any(map(_REQUIRES_GRAD, map(nodes.__getitem__, self.dead))):
            return self.all_dropped         # nothing to decide: every value that dies is dropped
        fingerprint = (list(map(getrefcount, nodes)), list(map(_FLAGS, map(nodes.__getitem__, self.flagged))),
                       [[position.get(source.id) for source in nodes[k].inputs] for k in self.realised])
        if self.memo is not None and self.memo[0] == fingerprint:
            reachable = self.memo[1]
        else:
            donating = donation.Donations(graph, self.plan, executor.POOL, executor.SLACK_BYTES)
            reachable = {k: donating.unshared(k) for _, candidates in self.donor_steps for k in candidates}
            reachable.update((p, not nodes[p].requires_grad or donating.unshared(p)) for p in self.dead)
            del donating
            self.memo = (fingerprint, reachable)
        del fingerprint
        pool, slack = executor.POOL, executor.SLACK_BYTES
        decision = []
        for i, candidates in self.donor_steps:
            chosen = None
            for k in candidates:
                if (reachable[k] and self._laid_out(k, i, buffers, nodes)
                        and donation.unreferenced(buffers, k, pool, slack)):
                    chosen = k
                    nodes[k].buffer = None
                    break
            decision.append(chosen)
        decision.extend(map(reachable.__getitem__, self.dead))
        return tuple(decision)

    def _laid_out(self, k, i, buffers, nodes):
        """Donations.laid_out for input k of step i, remembered per array (a weak reference does not
        count as one: donation compares reference counts)."""
        seen = self.laid.get(k)
        if seen is not None and seen() is buffers[k]:
            return True
        if not donation.laid_out(buffers[k], nodes[k], nodes[self.outputs_of[i]], executor.SLACK_BYTES):
            return False
        try:
            self.laid[k] = weakref.ref(buffers[k])
        except TypeError:
            pass
        return True

    def _fail(self, graph, i, site, layout, held, explain):
        """Raise the error of step i's failed check as executor.run does (with explain's detail
        unless the step wrote over an input). `held`: the run's (buffers, arena, pool arrays)."""
        step, buffers = self.steps[i], held[0]
        for position in step.positions:
            if position not in buffers:
                buffers[position] = layout.array(position, *held)
        executor._fail(graph, step, site, buffers, None if i in layout.donated_steps else explain)

    def _keep_finished(self, graph, layout, held, finished):
        """After a failed run that gave away an input: each value that its first `finished` steps
        computed and that a run launching kernel by kernel would still hold becomes its node's
        (donation.keep_computed); one that shares memory with others is copied out of it."""
        buffers, kept = held[0], {}
        for donor, keeper in layout.moves:
            if layout.donated[donor] < finished and keeper is not None:
                kept[keeper] = buffers[donor]
        for position in self.outputs_of[:finished]:
            if position in kept:
                continue
            if position in buffers or position in layout.donor_of:     # an array it keeps
                kept[position] = layout.array(position, *held)
            elif self.last.get(position, -1) >= finished:                # still to be read
                shape, dtype, _ = self.values[position]
                kept[position] = copy = executor.allocate(shape, dtype)
                copy[...] = layout.array(position, *held)
        donation.keep_computed(graph, kept, list(kept))
