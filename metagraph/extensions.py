"""The package's optional C extensions (setup.py builds them where Python's headers are found):
ops/_nodes.c builds a replay's nodes, runtime/_launch.c launches a plain replayed run. Each does
work the Python beside it also does, only faster; without it that Python runs."""
import importlib
import warnings


def load(name, abi, otherwise):
    """The extension module `name` when it is built and from this version of its source (its ABI
    number is `abi`), else None. An editable install keeps the binary beside its source, so an
    edited source leaves an older binary: that one is set aside with a warning saying what runs
    instead (`otherwise`)."""
    try:
        module = importlib.import_module(name)
    except ImportError:         # (not built: no compiler or no Python headers at install)
        return None
    if getattr(module, "ABI", None) != abi:
        warnings.warn(f"metagraph: {name} was built from another version of its source; {otherwise} until "
                      f"`pip install -e .` builds it again", stacklevel=2)
        return None
    return module
