"""The package's C extensions, built where a C compiler and Python's headers are found (optional:
without them the same work is done in Python: ops/node_replay.py, runtime/replay.py). Everything
else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(name, [source], optional=True, extra_compile_args=["-O2"])
                   for name, source in [("metagraph.ops._nodes", "metagraph/ops/_nodes.c"),
                                        ("metagraph.runtime._launch", "metagraph/runtime/_launch.c")]])
