"""Movement ops are reindex views: values, shapes and gradients (a scatter back)."""

import numpy as np
import pytest

import metagraph as mg
from tests.helpers import Case, case_tests

R = np.random.default_rng(3)
X = R.uniform(-1, 1, (2, 3, 4))


CASES = {
    "reshape": Case(lambda a: a.reshape(4, -1), lambda a: a.reshape(4, -1), X),
    "view_tuple": Case(lambda a: a.view((3, 8)), lambda a: a.reshape(3, 8), X),
    "reshape_ones": Case(lambda a: a.reshape(1, 2, 1, 12, 1), lambda a: a.reshape(1, 2, 1, 12, 1), X),
    "reshape_of_transpose": Case(
        lambda a: a.transpose(0, 2).reshape(8, 3), lambda a: a.transpose(2, 1, 0).reshape(8, 3), X
    ),
    "flatten": Case(lambda a: a.flatten(1), lambda a: a.reshape(2, 12), X),
    "flatten_middle": Case(lambda a: mg.flatten(a, 0, 1), lambda a: a.reshape(6, 4), X),
    "unflatten": Case(lambda a: a.unflatten(2, (2, 2)), lambda a: a.reshape(2, 3, 2, 2), X),
    "squeeze": Case(lambda a: a.squeeze(), lambda a: a.squeeze(), X.reshape(2, 1, 3, 1, 4)),
    "squeeze_dim": Case(lambda a: a.squeeze(1), lambda a: a.squeeze(1), X.reshape(2, 1, 3, 1, 4)),
    "unsqueeze": Case(lambda a: a.unsqueeze(-1), lambda a: a[..., None], X),
    "permute": Case(lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), X),
    "transpose": Case(lambda a: a.transpose(-1, 0), lambda a: a.swapaxes(-1, 0), X),
    "T": Case(lambda a: a.T, lambda a: a.T, X[0]),
    "mT": Case(lambda a: a.mT, lambda a: a.swapaxes(-1, -2), X),
    "expand": Case(lambda a: a.expand(3, -1, 4), lambda a: np.broadcast_to(a, (3, 2, 4)), X[:, :1, 0]),
    "broadcast_to": Case(
        lambda a: mg.broadcast_to(a, (2, 3, 4)), lambda a: np.broadcast_to(a, (2, 3, 4)), X[0, 0]
    ),
    "flip": Case(lambda a: a.flip((0, 2)), lambda a: np.flip(a, (0, 2)), X),
    "pad_constant": Case(
        lambda a: mg.nn.functional.pad(a, (1, 2, 0, 1), value=0.5),
        lambda a: np.pad(a, ((0, 0), (0, 1), (1, 2)), constant_values=0.5),
        X,
    ),
    "pad_negative_crops": Case(
        lambda a: mg.nn.functional.pad(a, (-1, 2)), lambda a: np.pad(a, ((0, 0), (0, 0), (0, 2)))[..., 1:], X
    ),
    "pad_reflect": Case(
        lambda a: mg.nn.functional.pad(a, (2, 3, 1, 1), mode="reflect"),
        lambda a: np.pad(a, ((0, 0), (1, 1), (2, 3)), mode="reflect"),
        X,
    ),
    "pad_replicate": Case(
        lambda a: mg.nn.functional.pad(a, (2, 1), mode="replicate"),
        lambda a: np.pad(a, ((0, 0), (0, 0), (2, 1)), mode="edge"),
        X,
    ),
    "pad_circular": Case(
        lambda a: mg.nn.functional.pad(a, (2, 1, 1, 0), mode="circular"),
        lambda a: np.pad(a, ((0, 0), (1, 0), (2, 1)), mode="wrap"),
        X,
    ),
    "cat": Case(
        lambda a, b: mg.cat([a, b, a], 1), lambda a, b: np.concatenate([a, b, a], 1), X, X[:, :2] * 2
    ),
    "cat_promotes": Case(
        lambda a, b: mg.cat([a, b]),
        lambda a, b: np.concatenate([a, b.astype(np.float64)]),
        X[0],
        np.ones((3, 4), dtype=np.int64),
        grad=False,
    ),
    "stack": Case(lambda a, b: mg.stack([a, b], -1), lambda a, b: np.stack([a, b], -1), X, -X),
    "split": Case(lambda a: a.split(3, -1), lambda a: (a[..., :3], a[..., 3:]), X),
    "split_sections": Case(lambda a: mg.split(a, [1, 2], 1), lambda a: (a[:, :1], a[:, 1:]), X),
    "chunk": Case(lambda a: a.chunk(2, 1), lambda a: (a[:, :2], a[:, 2:]), X),
    "unbind": Case(lambda a: a.unbind(1), lambda a: tuple(a[:, k] for k in range(3)), X),
    "narrow": Case(lambda a: a.narrow(2, 1, 2), lambda a: a[:, :, 1:3], X),
    "repeat": Case(lambda a: a.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3)), X),
    "repeat_new_dims": Case(lambda a: a.repeat(2, 2, 1, 1), lambda a: np.tile(a, (2, 2, 1, 1)), X),
    "tril": Case(lambda a: a.tril(), np.tril, X),
    "triu_offset": Case(lambda a: a.triu(1), lambda a: np.triu(a, 1), X),
    "tril_negative": Case(lambda a: mg.tril(a, -1), lambda a: np.tril(a, -1), X[0]),
    "contiguous": Case(lambda a: a.T.contiguous(), lambda a: a.T, X[1]),
}


test_forward, test_gradient = case_tests(CASES, float32=False)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x: x.reshape(5, -1), "invalid for input of size 24"),
        (lambda x: x.permute(0, 0, 1), "permutation"),
        (lambda x: x.expand(2, 5, 4), "cannot expand"),
        (lambda x: mg.cat([x, x[:, :, :2]], 1), "differ outside dimension 1"),
        (lambda x: x.split([1, 1], 1), "do not sum"),
        (lambda x: mg.nn.functional.pad(x, (4, 4), mode="reflect"), "smaller"),
        (lambda x: mg.nn.functional.pad(x, (1, 1), value=[0.0]), "pad: unsupported scalar"),
    ],
)
def test_errors_name_the_op(bad, match):
    with pytest.raises(mg.MetagraphError, match=match):
        bad(mg.tensor(X))


def test_circular_padding_wraps_around_at_most_once_as_in_pytorch():
    x = mg.tensor(np.arange(6.0).reshape(1, 2, 3))
    np.testing.assert_array_equal(mg.nn.functional.pad(x, (3, 0), mode="circular").numpy()[0, 0],
                                  [0, 1, 2, 0, 1, 2])
    with pytest.raises(mg.ShapeError, match="pad: circular padding .* more than once"):
        mg.nn.functional.pad(x, (4, 0), mode="circular")
    with pytest.raises(mg.ShapeError, match="more than once"):
        mg.nn.functional.pad(x, (0, 0, 0, 3), mode="circular")


def test_an_unknown_padding_mode_is_not_implemented():
    with pytest.raises(NotImplementedError, match="pad: unknown mode 'wrap'") as error:
        mg.nn.functional.pad(mg.ones(2, 3), (0, 0), mode="wrap")
    assert isinstance(error.value, mg.MetagraphError)
