"""Errors: the classes callers catch (PyTorch's RuntimeError and Python's own), what run-time
errors name, and clear messages where a bare Python or numpy error came out before."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.errors import OutOfMemory, Unsupported
from tests.helpers import needs

BACKENDS = ["numpy", "c", "llvm", "bang", "opencl"]

# (class, the standard classes it must also be)
CLASSES = [
    (mg.ShapeError, (RuntimeError, ValueError)),
    (mg.ArgumentError, (RuntimeError, ValueError)),
    (mg.DTypeError, (RuntimeError, TypeError)),
    (mg.ExprError, (RuntimeError, ValueError)),
    (mg.IndexOutOfRange, (RuntimeError, IndexError)),
    (OutOfMemory, (RuntimeError, MemoryError)),
    (Unsupported, (RuntimeError, NotImplementedError)),
]


@pytest.mark.parametrize("kind, bases", CLASSES, ids=[kind.__name__ for kind, _ in CLASSES])
def test_each_error_is_a_runtime_error_and_its_standard_class(kind, bases):
    for base in (mg.MetagraphError,) + bases:
        with pytest.raises(base, match="boom"):
            raise kind("boom")


def test_code_ported_from_pytorch_catches_shape_and_index_errors_as_runtime_errors():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        mg.ones(2, 3) @ mg.ones(2, 3)
    with pytest.raises(RuntimeError, match="out of bounds"):
        mg.ones(3)[mg.tensor([5])].numpy()


@pytest.fixture(params=BACKENDS)
def backend(request):
    needs(request.param)
    mg.set_backend(request.param)
    return request.param


def _message(fn):
    with pytest.raises(mg.IndexOutOfRange) as error:
        fn()
    return str(error.value)


def test_an_out_of_range_class_names_the_loss_the_user_called(backend):
    logits, target = mg.zeros(2, 3), mg.tensor([0, 5])
    for _ in range(2):       # recorded, then replayed
        assert _message(lambda: F.cross_entropy(logits, target).item()).startswith("cross_entropy:")
        assert _message(lambda: F.nll_loss(logits, target).item()).startswith("nll_loss:")
    # nll_loss replayed inside cross_entropy (recorded after a direct call) still names cross_entropy
    weighted = lambda: F.cross_entropy(logits, target, weight=mg.ones(3)).item()  # noqa: E731
    assert _message(weighted).startswith("cross_entropy:")


@pytest.mark.parametrize("op, call", [
    ("embedding", lambda: F.embedding(mg.tensor([7]), mg.zeros(3, 2))),
    ("gather", lambda: mg.gather(mg.zeros(3, 3), 1, mg.tensor([[3]]))),
    ("one_hot", lambda: mg.one_hot(mg.tensor([0, 7]), 3)),
    ("getitem", lambda: mg.zeros(3)[mg.tensor([3])]),
])
def test_a_run_time_bounds_error_names_the_op_and_the_users_line(backend, op, call):
    message = _message(lambda: call().numpy())
    assert message.startswith(f"{op}:") and "test_errors.py" in message


def test_an_allocation_too_large_names_the_op_the_bytes_and_the_line(backend):
    with pytest.raises(MemoryError) as error:
        mg.zeros(10 ** 12).numpy()
    assert isinstance(error.value, mg.MetagraphError)
    message = str(error.value)
    assert message.startswith("const:") and "4000000000" in message and "test_errors.py" in message
