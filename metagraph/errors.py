"""Errors raised to the user, and where in the user's code a graph node was created."""
import glob
import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The package's own programs (`python -m metagraph.bench` and the workloads it runs): users of the
# package, not part of it. Errors and the nodes they build name their lines, as a user's script's
# (not runpy's, where a walk out of the package would end), and their scalars are a user's
# (ops/scalars.py).
PROGRAM_FILES = frozenset(glob.glob(os.path.join(_PACKAGE_DIR, "bench*.py")))


class MetagraphError(RuntimeError):
    """Base class of every error metagraph raises on purpose. A RuntimeError, as PyTorch's errors
    are: code ported from PyTorch catches RuntimeError for shape and index errors. Each subclass
    is also the standard class a Python caller would catch (ValueError, IndexError, ...)."""


class ShapeError(MetagraphError, ValueError):
    """Operands whose shapes do not fit the operation."""


class ArgumentError(MetagraphError, ValueError):
    """An argument outside what the operation accepts (a mode, a probability, a size)."""


class DTypeError(MetagraphError, TypeError):
    """Operands whose dtypes do not fit the operation."""


class ExprError(MetagraphError, ValueError):
    """A malformed index expression."""


class IndexOutOfRange(MetagraphError, IndexError):
    """An index outside a tensor's bounds."""


class OutOfMemory(MetagraphError, MemoryError):
    """A buffer larger than the memory that can be allocated."""


class Unsupported(MetagraphError, NotImplementedError):
    """A mode or feature PyTorch has and metagraph does not implement."""


class DeviceError(MetagraphError):
    """Operands on different devices, or a device that is not available here."""


def user_location(first=2):
    """The (file, line) of the innermost stack frame outside the metagraph package, looking from
    frame `first` out (0 is this function's, 1 its caller's: always the package's). Asked at every
    new node: a filename test per frame, never a set of code objects (hashing a code object hashes
    its bytecode and constants: 8-40 us for a script's module-level code, where training loops live)."""
    frame = sys._getframe(first)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_PACKAGE_DIR) or name in PROGRAM_FILES:
            break
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def at(location):
    """Render a location for an error message."""
    return f"{os.path.basename(location[0])}:{location[1]}" if location else "<unknown>"


def fail(kind, op, message):
    """Raise `kind` for operation `op`, naming the user's line."""
    raise kind(f"{op}: {message} (at {at(user_location())})")


class CompileError(MetagraphError):
    """A toolchain rejected generated code, or no working toolchain exists."""
