"""A reduction's schedule: the list of primitive applications that turns its plain nest into the loops
it runs, as data that prints, parses back and replays.

A `Rewrite` names a primitive (blocks.py, packing.py) and its arguments: loop
variables, factors, a parameter's number. Variables a primitive creates are numbered from the
largest one in use, so a list applied to the same plain nest makes the same kernel every time:
the heuristic (heuristic.py) builds the default list by applying each step as it decides it
(`Scheduling`); tuning (pipeline/tuning.py) builds others, times them and remembers the winner as
its text (`text`, `parsed`: JSON, parsed, never evaluated).
"""
import json
from dataclasses import dataclass

from metagraph.compiler import blocks, packing


PRIMITIVES = {primitive.__name__: primitive for primitive in (     # each called (body, *arguments, extents)
    blocks.split, blocks.reorder, blocks.block, blocks.round_up, blocks.flatten_plane, blocks.jam,
    packing.pack, packing.merge, packing.drop_units)}


@dataclass(frozen=True)
class Rewrite:
    """One primitive application: its name (a key of PRIMITIVES) and arguments (ints, None, and
    tuples of them)."""
    primitive: str
    args: tuple

    def __str__(self):
        return f"{self.primitive}{self.args}"


def applied(body, extents, steps):
    """The nest `body` with `steps` applied in turn (`extents` gains the variables they make)."""
    for step in steps:
        body = apply(body, extents, step)
    return body


def apply(body, extents, step):
    """One step applied; ValueError where its primitive does not apply."""
    primitive = PRIMITIVES.get(step.primitive)
    if primitive is None:
        raise ValueError(f"no schedule primitive {step.primitive!r}")
    return primitive(body, *step.args, extents)


def text(steps):
    """The schedule as text (JSON: a list of [primitive, arguments])."""
    return json.dumps([[step.primitive, list(step.args)] for step in steps], separators=(",", ":"))


def parsed(source):
    """The steps of a schedule's text; ValueError where it is not one (a foreign or damaged cache
    entry is then left alone, never trusted)."""
    try:
        items = json.loads(source)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a schedule: {error}") from None
    if not isinstance(items, list):
        raise ValueError("not a schedule: not a list")
    steps = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in PRIMITIVES
                and isinstance(item[1], list)):
            raise ValueError(f"not a schedule step: {item!r}")
        steps.append(Rewrite(item[0], tuple(_frozen(arg) for arg in item[1])))
    return steps


def _frozen(arg):
    if isinstance(arg, list):
        return tuple(_frozen(a) for a in arg)
    if arg is None or isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    raise ValueError(f"not a schedule argument: {arg!r}")


class Scheduling:
    """A nest being scheduled: its body and extents, and the steps applied to it so far. `apply`
    applies a step and records it; `copy` is a trial that can be dropped."""

    def __init__(self, body, extents, steps=()):
        self.body, self.extents, self.steps = body, extents, list(steps)

    def apply(self, primitive, *args):
        step = Rewrite(primitive, args)
        self.body = apply(self.body, self.extents, step)
        self.steps.append(step)
        return self

    def copy(self):
        return Scheduling(self.body, dict(self.extents), self.steps)

    def adopt(self, other):
        """Take a trial's state (its extents into this one's dict, which the lowering shares)."""
        self.body, self.steps = other.body, other.steps
        self.extents.clear()
        self.extents.update(other.extents)
