"""Random index tuples (ints, slices, None, Ellipsis, integer tensors, bool masks) give PyTorch's
result, and numpy's where the two agree.

PyTorch and numpy place the broadcast dimensions of index tensors alike: where the tensors (and
masks) are separated by a slice, None or Ellipsis, those dimensions go first, else they stay in
place. They differ over integers (and 0-d index tensors): numpy counts an integer beside index
tensors as one more index tensor, PyTorch applies it first as a plain selection. Metagraph follows
PyTorch.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metagraph as mg

torch = pytest.importorskip("torch")


@st.composite
def indexing(draw):
    """(an array, its key for numpy, and which kinds the key holds)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    key, dim, ellipsis, kinds = [], 0, False, set()
    while dim < len(shape) and draw(st.booleans()):
        kind = draw(st.sampled_from(["int", "slice", "none", "ellipsis", "tensor", "mask"]))
        if kind == "ellipsis" and ellipsis:
            kind = "mask"           # one Ellipsis at most
        if kind == "ellipsis":
            key.append(Ellipsis)
            ellipsis, dim = True, len(shape) - _dims_after(draw, shape, dim)
            continue
        size = shape[dim]
        if kind == "none":
            key.append(None)
            continue
        if kind == "int":
            key.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            start, stop = draw(st.integers(-size - 1, size + 1)), draw(st.integers(-size - 1, size + 1))
            key.append(slice(start, stop, draw(st.sampled_from([1, 2, 3, -1, -2]))))
        elif kind == "tensor":
            own = batch[draw(st.integers(0, len(batch))):]       # broadcasts against the others
            key.append(np.array(draw(st.lists(st.integers(-size, size - 1), min_size=int(np.prod(own)),
                                              max_size=int(np.prod(own))))).reshape(own))
            kind = kind if own else "int"         # PyTorch selects with a 0-d tensor as with an int
        else:       # now and then of the wrong length: an IndexError in PyTorch
            length = draw(st.sampled_from([size, size, size, size + 1, max(size - 1, 1)]))
            key.append(np.array(draw(st.lists(st.booleans(), min_size=length, max_size=length))))
        kinds.add(kind)
        dim += 1
    return x, tuple(key), kinds


def _dims_after(draw, shape, dim):
    """How many dimensions the key will index after an Ellipsis placed at `dim`."""
    return draw(st.integers(0, len(shape) - dim))


def _as(module_tensor, key):
    return tuple(module_tensor(k) if isinstance(k, np.ndarray) else k for k in key)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(indexing())
def test_random_keys_index_as_pytorch_and_numpy_do(case):
    mg.set_backend("numpy")       # where the result's dimensions go is decided as the graph is built
    x, key, kinds = case
    try:
        want_numpy = x[key]
    except IndexError:
        want_numpy = None
    got = mg.tensor(x)[_as(mg.tensor, key)].numpy() if want_numpy is not None else None
    if want_numpy is not None and not ({"int", "tensor"} <= kinds or {"int", "mask"} <= kinds):
        np.testing.assert_array_equal(got, want_numpy)
    if not any(isinstance(k, slice) and k.step < 0 for k in key):
        try:
            want_torch = torch.tensor(x)[_as(torch.tensor, key)].numpy()
        except IndexError:
            with pytest.raises(IndexError):
                mg.tensor(x)[_as(mg.tensor, key)].numpy()
            return
        got = mg.tensor(x)[_as(mg.tensor, key)].numpy()
        np.testing.assert_array_equal(got, want_torch)


def test_an_out_of_range_index_tensor_raises_even_when_a_mask_leaves_nothing():
    """An empty region reads no index, yet a 0-d index tensor is checked as an int is, as PyTorch
    does (an index tensor of a dimension or more is not, there either)."""
    x = np.array([[[0.0], [1.0]]], dtype=np.float32)
    with pytest.raises(IndexError, match="index 1 is out of bounds for dimension 2 with size 1"):
        mg.tensor(x)[mg.tensor(np.array([False])), ..., mg.tensor(np.array(1))].numpy()
    assert mg.tensor(x)[mg.tensor(np.zeros(0, np.int64)), mg.tensor(np.array([[-3]]))].shape == (1, 0, 1)
    assert mg.tensor(x)[mg.tensor(np.array([False])), ..., mg.tensor(np.array(-1))].shape == (0, 2)


def test_tensors_separated_by_none_put_their_dimensions_first():
    x = np.arange(2 * 3 * 4 * 5 * 6).reshape(2, 3, 4, 5, 6)
    j, o = np.array([[0, 1, 1]]), np.array([[1], [0]])
    got = mg.tensor(x)[1, mg.tensor(j), None, mg.tensor(o), 1]
    np.testing.assert_array_equal(got.numpy(), torch.tensor(x)[1, torch.tensor(j), None, torch.tensor(o), 1])
    assert got.shape == (2, 3, 1, 6)


def test_tensors_separated_only_by_an_int_keep_their_place():
    x = np.arange(2 * 3 * 4 * 5 * 6).reshape(2, 3, 4, 5, 6)
    j, o = np.array([[0, 1, 1]]), np.array([[1], [0]])
    got = mg.tensor(x)[:, mg.tensor(j), 1, mg.tensor(o)]
    np.testing.assert_array_equal(got.numpy(), torch.tensor(x)[:, torch.tensor(j), 1, torch.tensor(o)])
    assert got.shape == (2, 2, 3, 6)
