"""The package's one C extension, built where a C compiler and Python's headers are found (optional:
without it ops/node.py builds replayed nodes in Python). Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("metagraph.ops._nodes", ["metagraph/ops/_nodes.c"], optional=True,
                             extra_compile_args=["-O2"])])
