"""metagraph/extensions.py: an optional C extension is used only when built from this source."""
import sys
import types

import pytest

from metagraph.extensions import load


def test_an_extension_built_from_this_source_is_used(monkeypatch):
    module = types.ModuleType("metagraph_fake_extension")
    module.ABI = 3
    monkeypatch.setitem(sys.modules, "metagraph_fake_extension", module)
    assert load("metagraph_fake_extension", 3, "Python runs") is module


def test_one_built_from_another_source_is_set_aside_saying_what_runs_instead(monkeypatch):
    module = types.ModuleType("metagraph_fake_extension")
    module.ABI = 2
    monkeypatch.setitem(sys.modules, "metagraph_fake_extension", module)
    with pytest.warns(UserWarning, match="another version of its source; Python runs until `pip install"):
        assert load("metagraph_fake_extension", 3, "Python runs") is None


def test_one_not_built_is_none():
    assert load("metagraph_no_such_extension", 1, "Python runs") is None
