import numpy as np
import pytest

import metagraph as mg


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed():
    mg.manual_seed(0)
