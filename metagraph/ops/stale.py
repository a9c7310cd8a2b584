"""Memos keyed by shapes forget what has not been used since their last sweep.

A composite's template (ops/recorded.py), a node signature's number (ops/node.py) and a graph's
schedule (pipeline/realize.py) are made once per shape and kept so that the next call with that
shape is cheap. A loop over new shapes (batch sizes 1..200) would keep every shape's: a small
CNN's grew 4 MiB per 100 sizes in templates, 2 MiB in signatures and 4 MiB in schedules.

So each making or use of an entry stamps it with its memo's generation (`Sweep.generation`), and
after `at` new entries a sweep drops the entries not stamped since the last sweep and begins the
next generation. `at` is half what the sweep kept (at least `floor`): a memo whose loop uses H
entries over and over holds at most H + 2 * max(floor, H) however many shapes pass through it (with
`at` as large as what was kept, the entries a sweep keeps because they were just made raised the
next `at`, and the memo grew by H at every sweep). An entry a loop uses every iteration stays as
long as an iteration makes fewer than `at` new entries, however many realisations it makes; a
loop that makes none never sweeps. A floor is a memo's least `at`: the new entries a loop over
new shapes may make an iteration without its own going too (schedules 8, templates 128, signature
numbers 1,024; a dropped signature gives its nodes a new number, so their graphs a new key).
Lower floors hold less: S5f 1.09 at these, 1.08 at half of each. (A limit by realisations, the
first form of this, dropped the entries of a loop with more realisations an iteration than it
looked back over.)
"""


class Sweep:
    """When a memo is due for a sweep (`due`, at each new entry), and which entries a sweep keeps:
    those stamped with the current `generation`."""

    def __init__(self, floor):
        self.floor = self.at = floor       # new entries between sweeps, at least
        self.made = 0                      # new entries since the last sweep
        self.generation = 0

    def due(self):
        """Count a new entry; whether the memo should be swept before it joins."""
        self.made += 1
        return self.made > self.at

    def done(self, kept):
        """The sweep has kept `kept` entries."""
        self.at = max(self.floor, kept // 2)
        self.made = 1                      # (the entry about to join)
        self.generation += 1

    def prune(self, table, stamp):
        """Sweep `table` (a dict) in place: drop each entry whose `stamp(value)` is not the current
        generation (in place: other threads may be reading it), then begin the next generation."""
        current = self.generation
        for key in [key for key, value in list(table.items()) if stamp(value) != current]:
            table.pop(key, None)
        self.done(len(table))
