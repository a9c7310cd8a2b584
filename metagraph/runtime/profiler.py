"""mg.profile(): what ran, what was compiled, how long it took and how much memory it held.

Besides its counters, a Profile keeps one event per kernel launch, compile, cache load, new
schedule and realisation (and whatever else a backend records: collectives, transfers), each with
its start, duration and thread, which `export_chrome_trace` writes in the Trace Event Format that
Perfetto (ui.perfetto.dev) and chrome://tracing open. Kernel launches carry what the kernel was
built from (compiler/provenance.py: `conv2d+batch_norm+relu @ model.py:41`), which `table()`
shows beside each kernel and `key_averages()` groups by.
"""
import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field

from metagraph.compiler.provenance import Origin
from metagraph.errors import ArgumentError
from metagraph.runtime import pool


@dataclass
class KernelStats:
    """One kernel's launches: calls, total seconds, its source, and what it was built from (the
    ops and lines of every launch, in order of first appearance)."""
    name: str
    source: str
    calls: int = 0
    seconds: float = 0.0
    origins: dict = field(default_factory=dict)     # provenance.Origin -> calls

    @property
    def ops(self):
        """The composite ops of its launches (`conv2d`, `batch_norm`, `relu`), in order."""
        return tuple(dict.fromkeys(op for found in self.origins for op in found.ops))

    @property
    def lines(self):
        """The user's (file, line)s its launches were built from, in order."""
        return tuple(dict.fromkeys(line for found in self.origins for line in found.lines))

    @property
    def origin(self):
        """`conv2d+batch_norm+relu @ model.py:41` (empty when no launch said)."""
        return str(Origin(self.ops, self.lines)) if self.origins else ""


@dataclass(slots=True)
class Event:
    """One span on the timeline: a category (kernel, compile, load, schedule, realise, ...), a
    name, its start (time.perf_counter seconds), its duration, its thread and its arguments."""
    category: str
    name: str
    start: float
    seconds: float
    thread: int
    args: dict


@dataclass
class OpStats:
    """Launches grouped by what they were built from (`key_averages`)."""
    key: str
    calls: int = 0
    seconds: float = 0.0
    kernels: dict = field(default_factory=dict)     # kernel name -> calls


class OpAverages(list):
    """`Profile.key_averages()`: OpStats, slowest first."""

    def table(self, row_limit=None):
        """The groups as text, one row each (at most `row_limit`)."""
        rows = [f"{'total ms':>10} {'calls':>7} {'us/call':>9} {'kernels':>7}  ops"]
        for stats in self[:row_limit]:
            rows.append(f"{stats.seconds * 1e3:>10.3f} {stats.calls:>7} "
                        f"{stats.seconds / stats.calls * 1e6:>9.1f} {len(stats.kernels):>7}  {stats.key}")
        return "\n".join(rows)


class Profile:
    """The report of a `with mg.profile() as prof:` block."""

    def __init__(self):
        self.launches = 0
        self.compiles = 0
        self.cache_hits = 0
        self.bytes_allocated = 0
        self.peak_bytes = 0
        self.live_bytes = 0
        self.collective_calls = 0         # metagraph.distributed's collectives: calls, bytes, seconds
        self.collective_bytes = 0
        self.collective_seconds = 0.0
        self.transfer_bytes = 0           # copies between the host and a device's memory
        self.transfer_seconds = 0.0
        self.pool_bytes = 0               # what the host's buffer pool holds at the block's end (its
        self.pool_free_bytes = 0          # limit: pool.POOL_MAX), and of that, arrays kept for reuse
        self._kernels = {}
        self.events = []          # Event per launch, compile, load, schedule, realisation, ...
        self.threads = {}         # native thread id -> its name, as events were recorded
        self._launch_args = {}    # (kernel name, origin) -> the arguments of its launches' events
        self.started = time.perf_counter()

    @property
    def kernels(self):
        """One entry per distinct kernel (.name, .calls, .seconds, .source, .ops, .lines), in
        launch order."""
        return list(self._kernels.values())

    def kernel(self, name, source, seconds, start=None, origin=None):
        """A launch of kernel `name` that took `seconds` from `start` (time.perf_counter), computing
        what `origin` (a provenance.Origin) says."""
        stats = self._kernels.get(name)
        if stats is None:
            stats = self._kernels[name] = KernelStats(name, source)
        stats.calls += 1
        stats.seconds += seconds
        self.launches += 1
        if origin is not None:
            stats.origins[origin] = stats.origins.get(origin, 0) + 1
        args = self._launch_args.get((name, origin))
        if args is None:        # one dict per kernel and origin, shared by its launches' events
            args = self._launch_args[name, origin] = {"kernel": name}
            if origin is not None:
                args.update(ops=origin.ops_text, lines=[f"{path}:{line}" for path, line in origin.lines])
        self._event("kernel", origin.ops_text if origin is not None else name,
                    time.perf_counter() - seconds if start is None else start, seconds, args)

    def record(self, category, name, start, seconds, **args):
        """An event of `category` named `name` that began at `start` (time.perf_counter) and took
        `seconds`, on the calling thread, with `args` (JSON values) shown beside it in a trace."""
        self._event(category, name, start, seconds, args)

    def _event(self, category, name, start, seconds, args):
        thread = threading.get_native_id()
        if thread not in self.threads:
            self.threads[thread] = threading.current_thread().name
        self.events.append(Event(category, name, start, seconds, thread, args))

    def collective(self, name, nbytes, start, seconds):
        """A collective (`all_reduce`, ...) that moved `nbytes` from this rank, began at `start`
        (time.perf_counter) and took `seconds`, waiting for the other ranks included."""
        self.collective_calls += 1
        self.collective_bytes += nbytes
        self.collective_seconds += seconds
        self.record("collective", name, start, seconds, bytes=nbytes)

    def transfer(self, direction, nbytes, start, seconds):
        """A copy of `nbytes` between the host and a device (`direction`: "to_device" or
        "to_host") that began at `start` (time.perf_counter) and took `seconds`."""
        self.transfer_bytes += nbytes
        self.transfer_seconds += seconds
        self.record("transfer", direction, start, seconds, bytes=nbytes)

    def allocate(self, nbytes):
        self.bytes_allocated += nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def free(self, nbytes):
        self.live_bytes -= nbytes

    def table(self):
        """The report as text: one row per kernel, slowest first, with the ops and lines it was
        built from."""
        rows = [f"{'kernel':<40} {'calls':>7} {'total ms':>10} {'us/call':>9}  ops @ lines"]
        for stats in sorted(self.kernels, key=lambda s: -s.seconds):
            rows.append(f"{stats.name:<40} {stats.calls:>7} {stats.seconds * 1e3:>10.3f} "
                        f"{stats.seconds / stats.calls * 1e6:>9.1f}  {stats.origin}")
        rows.append(f"launches {self.launches}, compiles {self.compiles}, cache hits {self.cache_hits}, "
                    f"allocated {self.bytes_allocated / 2 ** 20:.1f} MiB, "
                    f"peak {self.peak_bytes / 2 ** 20:.1f} MiB, buffer pool {self.pool_bytes / 2 ** 20:.1f} "
                    f"MiB ({self.pool_free_bytes / 2 ** 20:.1f} free)")
        if self.transfer_bytes:
            rows.append(f"transfers {self.transfer_bytes / 2 ** 20:.3f} MiB, "
                        f"{self.transfer_seconds * 1e3:.3f} ms")
        if self.collective_calls:
            rows.append(f"collectives {self.collective_calls}, {self.collective_bytes / 2 ** 20:.1f} MiB, "
                        f"{self.collective_seconds * 1e3:.3f} ms")
        return "\n".join(rows)

    def key_averages(self, group_by="ops"):
        """Kernel launches grouped by the composite ops they were built from (`group_by="ops"`:
        `conv2d+batch_norm+relu`) or by the user's lines (`"line"`: `model.py:41`), slowest first,
        as PyTorch's key_averages(); `.table()` prints them."""
        if group_by not in ("ops", "line"):
            raise ArgumentError(f"key_averages: group_by must be 'ops' or 'line', got {group_by!r}")
        groups = {}
        for stats in self.kernels:
            for found, calls in stats.origins.items() or [(None, stats.calls)]:
                if found is None:
                    key = stats.name
                else:
                    key = found.ops_text if group_by == "ops" else found.lines_text()
                group = groups.setdefault(key, OpStats(key))
                group.calls += calls
                group.seconds += stats.seconds * calls / stats.calls
                group.kernels[stats.name] = group.kernels.get(stats.name, 0) + calls
        return OpAverages(sorted(groups.values(), key=lambda g: -g.seconds))

    def chrome_trace(self):
        """The events in the Trace Event Format (a dict to dump as JSON): a complete event ("ph":
        "X", timestamps and durations in microseconds from the profile's start) per event, and a
        name per thread."""
        pid = os.getpid()
        trace = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "metagraph"}}]
        for thread, name in self.threads.items():
            trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": thread,
                          "args": {"name": name}})
        for event in self.events:
            trace.append({"name": event.name, "cat": event.category, "ph": "X", "pid": pid,
                          "tid": event.thread, "ts": round((event.start - self.started) * 1e6, 3),
                          "dur": round(event.seconds * 1e6, 3), "args": event.args})
        return {"traceEvents": trace, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path):
        """Write the trace (`chrome_trace`) to `path` as JSON, for Perfetto or chrome://tracing."""
        with open(path, "w") as stream:
            json.dump(self.chrome_trace(), stream)
        return path


_active = []


def current():
    """The innermost active profile, or None."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def profile():
    """Collect a Profile of everything realised inside the block."""
    report = Profile()
    _active.append(report)
    try:
        yield report
    finally:
        _active.remove(report)
        report.pool_bytes, report.pool_free_bytes = pool.HOST.held, pool.HOST.free_bytes()

