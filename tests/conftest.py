import numpy as np
import pytest

import metagraph as mg

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
