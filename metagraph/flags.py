"""Every environment variable metagraph reads, in one place.

METAGRAPH_BACKEND   backend to start with: numpy (more as code generators land)
METAGRAPH_DEBUG     1: a line per realisation; 2: also the graph realised
"""
import os


def _int(name, default):
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


BACKEND = os.environ.get("METAGRAPH_BACKEND", "")
DEBUG = _int("METAGRAPH_DEBUG", 0)
