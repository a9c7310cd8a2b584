"""The buffer plan of a replayed schedule (runtime/replay.py): where each value of a run lives.

A Layout is made once per decision a run can take (which inputs are donated, which values that
autograd would keep go back to the pool): the values that die in the run and are small share one
arena, placed by their lifetimes; the pool-sized ones share pool arrays of their exact size in
turn; the values that outlive the run get arrays of their own. The native loop's arrays (which slot
each kernel argument reads, where each arena value's slack is zeroed) are built here too.
"""
import bisect
import heapq

import numpy as np

from metagraph.runtime import executor, pool

ALIGNMENT = 64          # bytes: where each arena value starts (pool arrays are at least as aligned)


class Layout:
    """The buffer plan of one decision: where each slot's address comes from (a realised input, an
    array taken from the pool, a place in the arena) and the native loop's arrays.

    A value that dies in the run and is smaller than the pool's arrays (pool.POOLED_MIN) gets a
    place in the arena. The others get pool arrays of their exact size, shared in turn by values
    of that size whose lifetimes do not meet, the last of them keeping it if it outlives the run:
    what the pool gives executor.run as it goes, so that a replayed run holds the same memory
    (the arena could not lend the memory its dead values leave to the values that outlive it)."""

    def __init__(self, replay, decision):
        ffi, steps = replay.ffi, replay.steps
        self._new, self._null, self._cast = ffi.new, ffi.NULL, ffi.cast
        given = decision[:len(replay.donor_steps)]
        dropped = {p for p, gone in zip(replay.dead, decision[len(replay.donor_steps):]) if gone}
        self.donated = {}       # donated input -> the step that writes over it
        slot_of = dict(replay.base_slots)
        self.moves = []         # (donated input, the output that keeps its array, or None)
        donated_outputs = set()
        for (i, _), donor in zip(replay.donor_steps, given):
            if donor is not None:
                out = replay.outputs_of[i]
                slot_of[out] = slot_of[donor]
                self.donated[donor] = i
                donated_outputs.add(out)
                self.moves.append((donor, None if out in dropped else out))
        self.donated_steps = set(self.donated.values())
        self.donor_of = {replay.outputs_of[i]: donor for donor, i in self.donated.items()}
        self.values = replay.values
        placed = [p for p in replay.outputs_of if p not in donated_outputs]
        pooled = [p for p in placed if replay.values[p][2] + executor.SLACK_BYTES >= pool.POOLED_MIN]
        self.offsets, self.arena_bytes = placed_in_arena(
            [p for p in placed if p in dropped and p not in pooled], replay)
        born = {p: i for i, p in enumerate(replay.outputs_of)}
        arrays = sorted(shared_arrays(pooled, dropped, replay) + [[p] for p in placed
                                                            if p not in dropped and p not in pooled],
                        key=lambda shared: born[shared[0]])
        # per array: (its values' slots, shape, numpy dtype, the value that keeps it or None, whether
        # its slack must come zeroed: a value of it is computed by a step launched from Python; the
        # native loop zeroes the slack of each value it computes itself)
        python_values = {replay.outputs_of[i] for i in replay.python_steps}
        self.allocations = [(tuple(slot_of[p] for p in shared), *replay.values[shared[-1]][:2],
                             None if shared[-1] in dropped else shared[-1],
                             any(p in python_values for p in shared)) for shared in arrays]
        self.allocation_of = {p: j for j, shared in enumerate(arrays) for p in shared}
        self.first_value = [shared[0] for shared in arrays]       # (named by an allocation that fails)
        self.segments = _segments(len(steps), replay.python_steps, [born[shared[0]] for shared in arrays])
        self.read_slots = [(replay.base_slots[k], k) for k in replay.reads]
        self.slot_count = len(replay.base_slots) + len(replay.outer_slots)
        self.arena_slots = ffi.new("int64_t[]", [slot_of[p] for p in self.offsets])
        self.arena_offsets = ffi.new("int64_t[]", list(self.offsets.values()))
        starts, argument_slots = [0], []
        for i, step in enumerate(steps):
            argument_slots.extend(slot_of[p] for p in step.positions)
            if i in replay.outer_slots:
                argument_slots.append(replay.outer_slots[i])
            starts.append(len(argument_slots))
        self.arg_start = ffi.new("int64_t[]", starts)
        self.arg_slot = ffi.new("int64_t[]", argument_slots)
        self.slack_at = ffi.new("int64_t[]", [replay.values[p][2] for p in replay.outputs_of])
        self.plan = ffi.new("metagraph_plan *", {     # (its arrays are this object's and replay's)
            "kernels": replay.kernels, "arg_start": self.arg_start, "arg_slot": self.arg_slot,
            "slack_at": self.slack_at, "count": self.slot_count, "slack": executor.SLACK_BYTES})
        self.plan_address = int(ffi.cast("uintptr_t", self.plan))
        self.read_numbers = tuple(slot for slot, _ in self.read_slots)
        self.slot_type, self.slot_length = replay.slot_type, self.slot_count + 1 + replay.max_args
        self.spare = []         # (slot array, its address) of finished runs, taken again (pop is atomic)
        self.returned = []      # the last plain run's output array, when `reusable` (Replay.run_plain)
        self.reusable = False   # (set by Replay.plain: an output below the pool's size)
        self.outer = [(slot, ffi.from_buffer(replay.outer_values[j:j + 1]))     # (run-time extents)
                      for j, slot in enumerate(replay.outer_slots.values())]

    def slots(self):
        """(a run's slot array (the slots, the error word, a step's arguments), its address): a
        finished run's, its error word cleared, or a new one. Every slot a kernel reads is written
        before it runs."""
        try:
            slots, address = self.spare.pop()       # (another thread may have taken the last one)
        except IndexError:
            slots = self._new(self.slot_type, self.slot_length)
            for slot, extent in self.outer:
                slots[slot] = extent
            return slots, int(self._cast("uintptr_t", slots))
        slots[self.slot_count] = self._null
        return slots, address

    def array(self, position, buffers, arena, allocated):
        """The array of a value in a run: its own, or a view of its place in the arena or of the
        pool array it shares (`allocated`: the run's arrays of self.allocations)."""
        if position in buffers:
            return buffers[position]
        if position in self.donor_of:
            return buffers[self.donor_of[position]]
        shape, dtype, _ = self.values[position]
        if position in self.offsets:
            return np.ndarray(shape, dtype, arena, self.offsets[position])
        return np.ndarray(shape, dtype, allocated[self.allocation_of[position]])


    def zero_slack(self, position, arena):
        """Zero the slack past a value's place in the arena (the native loop does it for a kernel's
        output; arena memory held other values before)."""
        if position in self.offsets:
            end = self.offsets[position] + self.values[position][2]
            arena[end:end + executor.SLACK_BYTES] = 0


def _segments(count, python_steps, births):
    """(first, last, arrays) per stretch of steps the native loop launches at once (last None: step
    `first`, launched from Python), where `arrays` is how many of the plan's arrays (by the step
    computing their first value: `births`, in order) must have been taken before it runs: a stretch
    ends where a step launched from Python comes or an array's first value is computed."""
    segments, start, taken = [], 0, 0
    for i in range(count):
        due = taken
        while due < len(births) and births[due] <= i:
            due += 1
        if i in python_steps or due > taken:
            if start < i:
                segments.append((start, i, taken))
            taken, start = due, i
            if i in python_steps:
                segments.append((i, None, taken))
                start = i + 1
    if start < count:
        segments.append((start, count, taken))
    return segments


def shared_arrays(positions, dropped, replay):
    """`positions` (in the order the steps compute them) grouped into lists that can share one array
    in turn: values of one size, each computed after the one before has been read for the last
    time; a value outside `dropped` (it outlives the run) ends its list."""
    born = {p: i for i, p in enumerate(replay.outputs_of)}
    free, groups = {}, []       # size -> [(step after which it is free, group)], groups
    for p in positions:
        size = replay.values[p][2]
        reusable = free.get(size, [])
        found = next((j for j, (after, _) in enumerate(reusable) if after < born[p]), None)
        group = reusable.pop(found)[1] if found is not None else []
        if found is None:
            groups.append(group)
        group.append(p)
        if p in dropped:
            free.setdefault(size, []).append((replay.last.get(p, born[p]), group))
    return groups


def placed_in_arena(positions, replay):
    """({position: byte offset}, arena bytes) for values alive from the step computing them to their
    last reader, each taking its bytes and the slack past them: placed as an allocator would place
    them, step by step, first fit among the gaps that the values already read for the last time
    left (a search among all the values alive at once cost seconds on a large graph)."""
    born = {p: i for i, p in enumerate(replay.outputs_of)}
    alive, gaps, offsets, end, high = [], [], {}, 0, 0     # alive: heap of (last reader, offset, size)
    for p in sorted(positions, key=born.get):
        while alive and alive[0][0] < born[p]:
            _, offset, size = heapq.heappop(alive)
            end = _freed(gaps, offset, size, end)
        nbytes = replay.values[p][2]
        size = -(-(nbytes + executor.SLACK_BYTES) // ALIGNMENT) * ALIGNMENT if nbytes else 0
        found = next((j for j, (_, room) in enumerate(gaps) if room >= size), None)
        if found is None:
            offsets[p], end = end, end + size
            high = max(high, end)
        else:
            offset, room = gaps[found]
            offsets[p] = offset
            if room > size:
                gaps[found] = (offset + size, room - size)
            else:
                del gaps[found]
        heapq.heappush(alive, (replay.last.get(p, born[p]), offsets[p], size))
    return {p: offsets[p] for p in positions}, high


def _freed(gaps, offset, size, end):
    """Give [offset, offset + size) back to `gaps` (sorted, merged with its neighbours); a gap that
    reaches the arena's `end` shrinks it instead. Returns the new end."""
    j = bisect.bisect(gaps, (offset, size))
    gaps.insert(j, (offset, size))
    if j + 1 < len(gaps) and gaps[j][0] + gaps[j][1] == gaps[j + 1][0]:
        gaps[j] = (gaps[j][0], gaps[j][1] + gaps.pop(j + 1)[1])
    if j > 0 and gaps[j - 1][0] + gaps[j - 1][1] == gaps[j][0]:
        gaps[j - 1] = (gaps[j - 1][0], gaps[j - 1][1] + gaps.pop(j)[1])
    if gaps and gaps[-1][0] + gaps[-1][1] == end:
        end = gaps.pop()[0]
    return end
