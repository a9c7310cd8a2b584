"""Every error class a user catches is reachable as mg.<Name>: those of metagraph/errors.py, and
every other MetagraphError subclass the package defines (CheckpointError, CompileError, ...)."""
import importlib
import inspect
import pkgutil
import subprocess
import sys

import metagraph as mg
from metagraph import errors


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_of_errors_py_is_exported():
    public = [cls for name, cls in vars(errors).items()
              if inspect.isclass(cls) and issubclass(cls, BaseException) and not name.startswith("_")]
    assert {"MetagraphError", "OutOfMemory", "Unsupported"} <= {cls.__name__ for cls in public}
    for cls in public:
        assert getattr(mg, cls.__name__, None) is cls, cls.__name__


def test_every_metagraph_error_in_the_package_is_exported():
    for module in pkgutil.walk_packages(mg.__path__, "metagraph."):
        importlib.import_module(module.name)
    found = {cls for cls in _subclasses(mg.MetagraphError) if not cls.__name__.startswith("_")}
    assert {"CheckpointError", "CompileError", "LoaderTimeout"} <= {cls.__name__ for cls in found}
    for cls in found:
        assert getattr(mg, cls.__name__, None) is cls, f"{cls.__module__}.{cls.__name__}"


def test_compile_error_does_not_load_the_code_generators_at_import():
    """mg.CompileError lives in errors.py: `import metagraph` leaves the code generators unloaded."""
    code = ("import sys, metagraph as mg; assert 'metagraph.codegen.compiled' not in sys.modules; "
            "assert issubclass(mg.CompileError, mg.MetagraphError); assert not hasattr(mg, 'NoSuchError')")
    subprocess.run([sys.executable, "-c", code], check=True)
