"""The Tensor API: creation, inspection, laziness and sync points, errors at the user's line."""
import numpy as np
import pytest

import metagraph as mg


def test_creation_functions():
    np.testing.assert_array_equal(mg.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(mg.ones((2,), dtype=mg.int32).numpy(), [1, 1])
    np.testing.assert_array_equal(mg.full((2, 2), 7.5).numpy(), np.full((2, 2), 7.5, np.float32))
    np.testing.assert_allclose(mg.arange(1, 2, 0.25).numpy(), [1, 1.25, 1.5, 1.75])
    np.testing.assert_array_equal(mg.arange(10, 0, -3).numpy(), [10, 7, 4, 1])
    np.testing.assert_allclose(mg.linspace(-1, 1, 5).numpy(), np.linspace(-1, 1, 5), atol=1e-7)
    np.testing.assert_array_equal(mg.eye(2, 3).numpy(), np.eye(2, 3, dtype=np.float32))
    x = mg.tensor([[1, 2], [3, 4]], dtype=mg.float64)
    assert mg.zeros_like(x).dtype == mg.float64 and mg.ones_like(x).shape == (2, 2)
    assert mg.full_like(x, 3).tolist() == [[3, 3], [3, 3]]
    assert mg.empty(3).shape == (3,)


def test_random_is_reproducible_and_distributed():
    mg.manual_seed(42)
    a = mg.rand(1000).numpy()
    b = mg.randn(1000).numpy()
    mg.manual_seed(42)
    np.testing.assert_array_equal(a, mg.rand(1000).numpy())
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    assert abs(b.mean()) < 0.1 and abs(b.std() - 1) < 0.1
    r = mg.randint(3, 7, (500,)).numpy()
    assert r.dtype == np.int64 and r.min() == 3 and r.max() == 6
    assert sorted(mg.randperm(5).tolist()) == [0, 1, 2, 3, 4]
    assert mg.rand_like(mg.zeros(2, dtype=mg.float64)).dtype == mg.float64


def test_inspection():
    x = mg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert x.shape == (2, 3) and x.ndim == 2 and x.dim() == 2 and x.numel() == 6 and len(x) == 2
    assert x.size() == (2, 3) and x.size(-1) == 3
    assert x.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert x[1, 2].item() == 6.0 and float(x[0, 0]) == 1.0 and int(x[1, 1]) == 5
    assert "tensor([[1., 2., 3.]" in repr(x)
    assert [row.tolist() for row in x] == [[1, 2, 3], [4, 5, 6]]
    assert np.asarray(x).shape == (2, 3)
    assert mg.get_backend() in mg.backend.BACKENDS


def test_numpy_is_a_read_only_view_and_np_array_a_copy():
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="read-only"):
        x.numpy()[0] = 99
    copy = np.array(x)
    copy[0] = 99
    assert x.tolist() == [1.0, 2.0]


def test_input_data_is_copied():
    data = np.array([1.0, 2.0])
    x = mg.tensor(data)
    data[0] = 5
    assert x.tolist() == [1.0, 2.0]


def test_laziness_nothing_runs_until_asked():
    x = mg.ones(3)
    y = x * 2 + 1
    assert y.node.buffer is None
    mg.sync(y)
    assert y.node.buffer is not None and y.node.op == "buffer"


def test_in_place_operators_and_methods():
    x = mg.tensor([1.0, 2.0])
    y = x                      # an alias sees the update, as in PyTorch
    x += 1
    x *= 2
    x.sub_(1).div_(2)
    assert y is x and x.tolist() == [1.5, 2.5]
    x.fill_(3)
    x.zero_()
    x.copy_(mg.tensor([7.0]))
    assert x.tolist() == [7.0, 7.0]
    x.clamp_(max=5)
    assert x.tolist() == [5.0, 5.0]


def test_truth_value_of_many_elements_is_ambiguous():
    with pytest.raises(mg.MetagraphError, match="ambiguous"):
        bool(mg.ones(2))
    with pytest.raises(ValueError, match="item"):
        mg.ones(2).item()


def test_errors_name_the_users_line():
    with pytest.raises(mg.ShapeError) as info:
        mg.ones(2, 3) + mg.ones(4)     # this line is named in the message
    assert "add" in str(info.value) and "(2, 3) and (4,)" in str(info.value)
    assert "test_tensor.py:" in str(info.value)


def test_runtime_errors_name_the_line_that_built_the_node():
    bad = mg.tensor([5, 2]) // mg.tensor([0, 1])
    with pytest.raises(mg.MetagraphError, match=r"division by zero \(node created at test_tensor.py:\d+"):
        bad.numpy()


def test_unsupported_data_is_refused():
    with pytest.raises(TypeError, match="cannot make a tensor"):
        mg.tensor(["a", "b"])


def test_linspace_of_one_step_is_its_start_and_of_zero_steps_empty():
    assert mg.linspace(5, 10, 1).tolist() == [5.0]
    assert mg.linspace(5, 10, 0).shape == (0,)
    assert mg.linspace(5, 10, 2).tolist() == [5.0, 10.0]


@pytest.mark.parametrize("data, match", [
    ([[1, 2], [3]], "ragged: expected sequences of length 2 at dimension 1, got one of length 1"),
    ([[[1, 2], [3, 4]], [[1, 2], [3]]], "at dimension 2, got one of length 1"),
    ([[1, 2], 3], "ragged: the entries along dimension 0 mix sequences and numbers"),
])
def test_ragged_data_is_refused_naming_the_dimension(data, match):
    with pytest.raises(mg.ShapeError, match=match):
        mg.tensor(data)


@pytest.mark.parametrize("data, dtype, match", [
    ([2 ** 64], None, r"value 18446744073709551616 is outside the range of int64"),
    ([2 ** 63], None, r"value 9223372036854775808 is outside the range of int64"),
    ([[-2 ** 63 - 1, 0]], None, "outside the range of int64"),
    ([300], mg.uint8, r"value 300 is outside the range of uint8 \[-255, 255\]"),
    ([2 ** 31], mg.int32, "outside the range of int32"),
    ([1e30], mg.int64, "outside the range of int64"),
    ([2 ** 64], mg.int8, "outside the range of int8"),
])
def test_integers_outside_their_dtypes_range_are_refused(data, dtype, match):
    with pytest.raises(mg.ArgumentError, match=match):
        mg.tensor(data, dtype=dtype)


def test_values_in_range_convert_as_pytorch_converts_them():
    assert mg.tensor([-2 ** 63, 2 ** 63 - 1]).tolist() == [-2 ** 63, 2 ** 63 - 1]
    assert mg.tensor([-1], dtype=mg.uint8).tolist() == [255]         # PyTorch wraps down to -255
    assert mg.tensor([1.5, 2 ** 64]).tolist() == [1.5, float(2 ** 64)]
    assert mg.tensor([2 ** 64], dtype=mg.float64).tolist() == [float(2 ** 64)]
    assert mg.tensor([1.7], dtype=mg.int64).tolist() == [1]
