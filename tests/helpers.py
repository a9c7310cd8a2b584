"""Shared checks: forward values against a reference, gradients against finite differences."""
import os

import numpy as np
import pytest

import metagraph as mg


def needs(backend):
    """Skip the calling test where `backend` cannot work on this machine (e.g. no C compiler, no
    OpenCL platform); fail it instead where METAGRAPH_REQUIRE_BACKENDS (comma-separated) names it,
    as CI does (.ci/run)."""
    try:
        mg.backend._instance(backend)
    except mg.MetagraphError as error:
        reason = f"backend {backend!r} is unavailable: {str(error).splitlines()[0]}"
        if backend in os.environ.get("METAGRAPH_REQUIRE_BACKENDS", "").split(","):
            pytest.fail(f"{reason} (METAGRAPH_REQUIRE_BACKENDS requires it)")
        pytest.skip(reason)


def trained(model, optimizer, batches):
    """(losses, parameters as arrays afterwards) of one cross-entropy step of `optimizer` per (x, y)
    of `batches`."""
    losses = []
    for x, y in batches:
        loss = mg.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.numpy().copy() for p in model.parameters()]


def as_tensors(arrays, requires_grad=False):
    return [mg.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f")
            if isinstance(a, np.ndarray) else a for a in arrays]


class Case:
    """A composite's test: metagraph fn, numpy reference, inputs, and whether to check gradients."""

    def __init__(self, fn, ref, *arrays, grad=True, rtol=1e-6, atol=1e-7):
        self.fn, self.ref, self.arrays, self.grad, self.rtol, self.atol = fn, ref, arrays, grad, \
            rtol, atol


def case_tests(cases, float32=True):
    """The parametrised tests a table of Cases gets: forward, float32 (optional) and gradient."""

    @pytest.mark.parametrize("name", sorted(cases))
    def test_forward(name):
        run_forward(cases[name])

    @pytest.mark.parametrize("name", sorted(cases))
    def test_float32(name):
        run_float32(cases[name])

    @pytest.mark.parametrize("name", sorted(n for n in cases if cases[n].grad))
    def test_gradient(name):
        run_grad(cases[name])
    return (test_forward, test_float32, test_gradient) if float32 else (test_forward, test_gradient)


def run_forward(case):
    check_forward(case.fn, case.ref, *case.arrays, rtol=case.rtol, atol=case.atol)


def run_float32(case):
    """The same case in float32: values close to the float64 reference."""
    arrays = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a
              for a in case.arrays]
    got = case.fn(*as_tensors(arrays))
    want = case.ref(*case.arrays)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        w = np.asarray(w)
        if w.dtype == np.float64:
            assert g.dtype == mg.float32
        np.testing.assert_allclose(g.numpy().astype(np.float64), w, rtol=1e-4, atol=1e-4, equal_nan=True)


def run_grad(case):
    check_grad(case.fn, *case.arrays)


def check_forward(fn, ref, *arrays, rtol=1e-5, atol=1e-6):
    """fn on Tensors equals ref on numpy arrays (values, shape and dtype)."""
    assert all(a.size for a in arrays if isinstance(a, np.ndarray)), "an empty input tests nothing"
    got = fn(*as_tensors(arrays))
    want = ref(*arrays)
    got_list = list(got) if isinstance(got, tuple) else [got]
    want_list = list(want) if isinstance(want, tuple) else [want]
    assert len(got_list) == len(want_list)
    for g, w in zip(got_list, want_list):
        w = np.asarray(w)
        value = g.numpy()
        assert value.shape == w.shape, f"shape {value.shape} != {w.shape}"
        assert value.dtype == w.dtype, f"dtype {value.dtype} != {w.dtype}"
        np.testing.assert_allclose(value, w, rtol=rtol, atol=atol, equal_nan=True)


def numeric_grad(fn, arrays, projection, which, eps=1e-6):
    """d(sum(fn(arrays) * projection))/d(arrays[which]) by central differences (float64)."""
    base = arrays[which]
    grad = np.zeros_like(base)
    for position in np.ndindex(base.shape):
        values = []
        for step in (eps, -eps):
            shifted = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
            shifted[which][position] += step
            with mg.no_grad():
                out = fn(*as_tensors(shifted))
            values.append(float(np.sum(out.numpy() * projection)))
        grad[position] = (values[0] - values[1]) / (2 * eps)
    return grad


def check_grad(fn, *arrays, rtol=1e-4, atol=1e-6, seed=0):
    """Every float64 input's gradient (through metagraph's autograd) equals finite differences."""
    arrays = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
              for a in arrays]
    tensors = as_tensors(arrays, requires_grad=True)
    out = fn(*tensors)
    out = out[0] if isinstance(out, tuple) else out
    projection = np.random.default_rng(seed).standard_normal(out.shape)
    loss = (out * mg.tensor(projection)).sum()
    float_inputs = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    assert float_inputs, "nothing to differentiate"
    grads = mg.grad(loss, [tensors[i] for i in float_inputs])

    def first(*ts):
        result = fn(*ts)
        return result[0] if isinstance(result, tuple) else result
    for i, grad in zip(float_inputs, grads):
        want = numeric_grad(first, arrays, projection, i)
        np.testing.assert_allclose(grad.numpy(), want, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
