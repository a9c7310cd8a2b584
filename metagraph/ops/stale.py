"""Memos keyed by shapes forget what recent realisations have not used.

A composite's template (ops/recorded.py), a node signature's number (ops/node.py) and a graph's
schedule (pipeline/realize.py) are made once per shape and kept so that the next call with that
shape is cheap. A loop over new shapes (batch sizes 1..200) would keep every shape's: a small
CNN's grew 4 MiB per 100 sizes in templates, 2 MiB in signatures and 4 MiB in schedules. Each entry therefore remembers the realisation it was last used in
(ops/scalars.Realisations, which the executor counts), and when a memo has doubled since its last
sweep the entries unused for KEPT_REALISATIONS realisations go. A loop's own entries are used every
iteration and stay, however many there are; the sweep's cost is spread over the entries that made
the memo double.
"""
from metagraph.ops.scalars import Realisations

KEPT_REALISATIONS = 8        # an entry unused for this many realisations may be dropped


class Sweep:
    """When a memo is due for a sweep (`due(size)`), and what a sweep keeps (`oldest`)."""

    def __init__(self, floor):
        self.floor = self.at = floor       # a memo smaller than `floor` is never swept

    def due(self, size):
        return size >= self.at

    @staticmethod
    def oldest():
        """The earliest realisation an entry must have been used in to stay."""
        return Realisations.count - KEPT_REALISATIONS

    def done(self, size):
        """The sweep has left `size` entries: the next is due when the memo has doubled."""
        self.at = max(self.floor, 2 * size)
