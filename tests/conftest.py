import os
import shutil
import tempfile

import numpy as np
import pytest

# One kernel cache for the whole run, never the user's ~/.cache/metagraph: kernels one test compiles
# serve the others, and subprocess tests inherit it through the environment. Set before metagraph
# is imported (flags reads the environment then; backends open the cache on first use).
CACHE_DIR = tempfile.mkdtemp(prefix="metagraph-tests-")
os.environ["METAGRAPH_CACHE_DIR"] = CACHE_DIR

import metagraph as mg  # noqa: E402  (after the cache directory is chosen)

mg.flags.CACHE_DIR = CACHE_DIR      # in case a plugin imported metagraph before this file

# No tuning in the suite (it would compile variants of every slow kernel run twice); the tuning
# tests turn it on themselves.
mg.flags.TUNE = 0


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed():
    mg.manual_seed(0)


@pytest.fixture(autouse=True)
def _restore_backend():
    """A test that switches backends hands the next test the backend it found."""
    before = mg.get_backend()
    yield
    if mg.get_backend() != before:
        mg.set_backend(before)


@pytest.fixture(autouse=True)
def _fresh_backward_templates(monkeypatch):
    """No backward pass or gradient rule recorded in one test is replayed in another: tests replace
    gradient rules (a replay would give the rules' graph from before)."""
    from metagraph.ops import recorded, recorded_backward
    monkeypatch.setattr(recorded_backward, "_TEMPLATES", {})
    monkeypatch.setattr(recorded_backward, "_SEEN", {})
    monkeypatch.setattr(recorded, "_TEMPLATES", {})


def pytest_sessionfinish(session):
    shutil.rmtree(CACHE_DIR, ignore_errors=True)
