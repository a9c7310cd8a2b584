"""mg.profile(): what ran, what was compiled, how long it took and how much memory it held."""
import contextlib
from dataclasses import dataclass


@dataclass
class KernelStats:
    name: str
    source: str
    calls: int = 0
    seconds: float = 0.0


class Profile:
    """The report of a `with mg.profile() as prof:` block."""

    def __init__(self):
        self.launches = 0
        self.compiles = 0
        self.cache_hits = 0
        self.bytes_allocated = 0
        self.peak_bytes = 0
        self.live_bytes = 0
        self._kernels = {}

    @property
    def kernels(self):
        """One entry per distinct kernel (.name, .calls, .seconds, .source), in launch order."""
        return list(self._kernels.values())

    def kernel(self, name, source, seconds):
        stats = self._kernels.setdefault(name, KernelStats(name, source))
        stats.calls += 1
        stats.seconds += seconds
        self.launches += 1

    def allocate(self, nbytes):
        self.bytes_allocated += nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def free(self, nbytes):
        self.live_bytes -= nbytes

    def table(self):
        """The report as text: one row per kernel, slowest first."""
        rows = [f"{'kernel':<40} {'calls':>7} {'total ms':>10} {'us/call':>9}"]
        for stats in sorted(self.kernels, key=lambda s: -s.seconds):
            rows.append(f"{stats.name:<40} {stats.calls:>7} {stats.seconds * 1e3:>10.3f} "
                        f"{stats.seconds / stats.calls * 1e6:>9.1f}")
        rows.append(f"launches {self.launches}, compiles {self.compiles}, cache hits {self.cache_hits}, "
                    f"allocated {self.bytes_allocated / 2 ** 20:.1f} MiB, "
                    f"peak {self.peak_bytes / 2 ** 20:.1f} MiB")
        return "\n".join(rows)


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


@contextlib.contextmanager
def suspended():
    """Nothing inside the block is reported (the backend's own start-up work)."""
    saved = _active[:]
    _active.clear()
    try:
        yield
    finally:
        _active.extend(saved)
