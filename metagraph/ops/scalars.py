"""Python scalars that change at one call site become run-time values instead of constants.

A scalar operand (`x * 0.5`, `x + i`) is a `const` node: its value is part of the graph's key and
is compiled into the kernels, which then fold it (`x * 1`, `x + 0` simplify, and a literal costs
no load). That is right for a scalar that stays the same, and wrong for one that changes every
iteration (`x * i`, a hand-written warm-up `lr * step / warmup`): each value made a new graph key,
lowered and compiled new kernels (~48 ms a step).

The rule: a scalar that the user's code gives an element-wise op is folded as a constant unless
its call site gives a value it has not given before, after a realisation has run since the site's
first value. From then on the site's scalars are 0-d buffers that the kernels read (a run-time
argument, as the optimizers pass their hyperparameters), so a new value changes no graph key and
compiles nothing.
- A site is the chain of calls from the user's line into the op that made the constant (each
  frame's code and instruction), with the constant's shape and dtype: a loop's `x * i` is one site.
- Only scalars the user's line hands to a tensor operator, an element-wise function or method
  (their frames are all in WRAPPERS): a scalar that the package computes (a mean's count, an
  initialiser's bound, a layer's hyperparameter) follows from shapes and settings, and where those
  change, so does the graph; it stays folded.
- New values after a realisation are what a loop over iterations gives. Values that differ within
  one graph (a user's lazy chain `a = a * 0.5 + k`, realised at the end and built again) are parts
  of one graph whose structure repeats, and stay folded. A site remembers up to SITE_VALUES values.
- The shared constant cache (ops/math.py `const`) is looked up first, so that a constant operand
  costs nothing more: a value found there is checked against its site only while some site of its
  shape and dtype varies (`Sites.varying`; one warm-up loop made every `x * 0.5` of the process
  walk its call stack, 2.0 -> 3.2 us). Until then a site whose values other code has all made
  shared constants of its shape (small integers, say) is not seen to vary, and compiles once per
  such value.
The table of sites is bounded (SITE_TABLE_SIZE, oldest forgotten first).
"""
import os

from metagraph.errors import _PACKAGE_DIR, PROGRAM_FILES

SITE_TABLE_SIZE = 4096
SITE_VALUES = 1024
# the package's files between a user's line and the constant its scalar operand becomes
WRAPPERS = frozenset(os.path.join(_PACKAGE_DIR, *name.split("/")) for name in (
    "tensor.py", "ops/node.py", "ops/recorded.py", "ops/math.py", "ops/rounding.py", "ops/special.py"))
_VARIES = "varies"
_sites = {}     # (call path, shape, dtype) -> _VARIES, or (realisation count at its first value, values)


class Realisations:
    """How many graphs the executor has run (runtime/executor.py counts them): what tells a value
    given in a later iteration from one given in the same graph."""
    count = 0


class Sites:
    """How many sites in the table vary, by the (shape, dtype) of their constants: a constant
    operand of a kind no varying site has skips the site walk (an empty dict on the fast path)."""
    varying = {}


def varies(value, shape, dtype, frame):
    """Whether the scalar `value` (of `shape` and `dtype`), given at the call site whose innermost
    frame is `frame`, is to be a run-time value (see the module docstring). Records the value."""
    path = _user_call(frame)
    if path is None:
        return False
    site = (path, shape, dtype)
    seen = _sites.get(site)
    if seen is _VARIES:
        return True
    if type(value) is not int:
        value = repr(value)          # -0.0 is not 0.0, nan is nan, 1.0 is not 1
    if seen is None:
        if len(_sites) >= SITE_TABLE_SIZE:
            oldest = next(iter(_sites))
            if _sites.pop(oldest) is _VARIES:
                _count(oldest[1:], -1)
        _sites[site] = (Realisations.count, {value})
        return False
    first, values = seen
    if value in values:
        return False
    if first != Realisations.count:
        _sites[site] = _VARIES
        _count((shape, dtype), 1)
        return True
    if len(values) < SITE_VALUES:
        values.add(value)
    return False


def _user_call(frame):
    """The calls from `frame` out to the user's frame, inclusive, as a flat tuple of (id of the
    code, instruction offset) pairs; None when a frame on the way is the package's but not one of
    WRAPPERS (the scalar was computed by the package). Code objects by id, since hashing one hashes
    its bytecode; a module's functions live as long as the process."""
    path = []
    while frame is not None:
        code = frame.f_code
        path += (id(code), frame.f_lasti)
        name = code.co_filename
        if not name.startswith(_PACKAGE_DIR) or name in PROGRAM_FILES:
            return tuple(path)
        if name not in WRAPPERS:
            return None
        frame = frame.f_back
    return None


def forget():
    """Forget every site (tests start from a clean table)."""
    _sites.clear()
    Sites.varying.clear()


def _count(kind, change):
    """Sites.varying's count of varying sites of `kind` changed by `change` (none: no entry)."""
    count = Sites.varying.get(kind, 0) + change
    if count:
        Sites.varying[kind] = count
    else:
        Sites.varying.pop(kind, None)
