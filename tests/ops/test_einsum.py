"""einsum: a table of equations against torch.einsum (values and gradients), random equations
against numpy.einsum, finite differences in float64, the errors, and the kernels it builds."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import metagraph as mg
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from tests.helpers import check_grad

R = np.random.default_rng(5)

EQUATIONS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),                    # implicit output
    (" i j , j k -> k i ", [(2, 3), (3, 4)]),       # spaces, transposed output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhld,bhmd->bhlm", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ii->i", [(3, 3)]),                            # diagonal
    ("ii->", [(4, 4)]),                             # trace
    ("ii", [(4, 4)]),
    ("iij,jk->ki", [(3, 3, 2), (2, 4)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("i,j->ij", [(3,), (2,)]),                      # outer product
    ("i,i->", [(4,), (4,)]),
    ("i,i->i", [(1,), (3,)]),                       # a size-1 subscript broadcasts
    ("ij,jk->i", [(2, 3), (3, 4)]),                 # k summed out of one operand first
    ("...ij,...jk->...ik", [(5, 1, 2, 3), (4, 3, 4)]),
    ("...ij,...jk", [(2, 2, 3), (3, 4)]),
    ("...i->i", [(2, 3, 4)]),                       # ellipsis dimensions summed
    ("...ii->...i", [(2, 3, 3)]),
    ("i...i->...", [(3, 2, 3)]),
    ("...,...", [(2, 3), (3,)]),
    ("bA,Ba", [(2, 3), (3, 2)]),                    # implicit order: upper case first
    ("", [()]),
    ("...,->...", [(2,), ()]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ab,cd,bc->da", [(2, 3), (4, 5), (3, 4)]),
    ("i,i,i->", [(3,), (3,), (3,)]),
    ("ijk,jl,kl->li", [(2, 3, 4), (3, 5), (4, 5)]),
]


@pytest.mark.parametrize("equation, shapes", EQUATIONS, ids=[e or "empty" for e, _ in EQUATIONS])
def test_against_torch_values_and_gradients(equation, shapes):
    torch = pytest.importorskip("torch")
    arrays = [R.standard_normal(shape) for shape in shapes]
    ours = [mg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, want = mg.einsum(equation, *ours), torch.einsum(equation, *theirs)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    projection = R.standard_normal(got.shape)
    (got * mg.tensor(projection)).sum().backward()
    (want * torch.tensor(projection)).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_float32_and_integers():
    a, b = R.standard_normal((3, 4)).astype(np.float32), R.standard_normal((4, 2)).astype(np.float32)
    got = mg.einsum("ij,jk->ik", mg.tensor(a), mg.tensor(b))
    assert got.dtype == mg.float32
    np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5, atol=1e-6)
    x = R.integers(-5, 5, (3, 3)).astype(np.int32)
    trace = mg.einsum("ii", mg.tensor(x))
    assert trace.dtype == mg.int32 and trace.item() == np.trace(x)


def test_operand_list_and_sublist_forms():
    a, b = R.standard_normal((5, 2, 3)), R.standard_normal((3, 4))
    want = np.einsum("...ij,jk->...ik", a, b)
    np.testing.assert_allclose(mg.einsum("...ij,jk->...ik", [mg.tensor(a), mg.tensor(b)]).numpy(), want)
    got = mg.einsum(mg.tensor(a), [..., 0, 1], mg.tensor(b), [1, 2], [..., 0, 2])
    np.testing.assert_allclose(got.numpy(), want)
    implicit = mg.einsum(mg.tensor(a[0]), [0, 1], mg.tensor(b), [1, 2])
    np.testing.assert_allclose(implicit.numpy(), a[0] @ b)


@pytest.mark.parametrize("equation, shapes", [("ij,jk->ik", [(3, 4), (4, 2)]), ("ii->i", [(3, 3)]),
                                              ("bij,bkj->bik", [(2, 2, 3), (2, 3, 3)]),
                                              ("...i,...i->...", [(2, 3), (3,)]),
                                              ("ij,jk,k->i", [(2, 3), (3, 2), (2,)])])
def test_gradients_against_finite_differences(equation, shapes):
    check_grad(lambda *xs: mg.einsum(equation, *xs), *[R.standard_normal(s) for s in shapes])


@st.composite
def equations(draw):
    """(equation, shapes): 1-3 operands over a few letters (repeats allowed), an ellipsis in
    some, sizes 1-4; an explicit output of distinct letters (and the ellipsis) or none."""
    letters = "abcdA"
    sizes = {letter: draw(st.integers(1, 4)) for letter in letters}
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    terms, shapes, any_dots = [], [], False
    for _ in range(draw(st.integers(1, 3))):
        own = draw(st.lists(st.sampled_from(letters), max_size=4))
        shape = [sizes[letter] for letter in own]
        if draw(st.booleans()):
            at = draw(st.integers(0, len(own)))
            dims = batch[len(batch) - draw(st.integers(0, len(batch))):]
            dims = [1 if draw(st.booleans()) else d for d in dims]      # size 1 broadcasts
            own, shape, any_dots = own[:at] + ["..."] + own[at:], shape[:at] + dims + shape[at:], True
        terms.append("".join(own))
        shapes.append(tuple(shape))
    equation = ",".join(terms)
    if draw(st.booleans()):
        used = sorted({c for term in terms for c in term if c != "."})
        output = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        if any_dots:
            output.insert(draw(st.integers(0, len(output))), "...")
        equation += "->" + "".join(output)
    return equation, shapes


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem=equations(), seed=st.integers(0, 99))
def test_random_equations_against_numpy(problem, seed):
    equation, shapes = problem
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape) for shape in shapes]
    want = np.einsum(equation, *arrays)
    got = mg.einsum(equation, *[mg.tensor(a) for a in arrays])
    assert got.shape == want.shape, equation
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10, err_msg=equation)


@pytest.mark.parametrize("args, kind, match", [
    (("ij,jk", (2, 3)), mg.ArgumentError, r"fewer operands \(1\) were provided than the equation specifies"),
    (("ij", (2, 3), (3, 4)), mg.ArgumentError, r"more operands \(2\)"),
    (("ijk", (2, 3)), mg.ShapeError,
     r"'ijk' with operand shapes \[\(2, 3\)\]: operand 0 has 2 dimensions but 3"),
    (("...ij", (3,)), mg.ShapeError, "fewer than its 2 subscripts"),
    (("ii->i", (3, 4)), mg.ShapeError, "repeated in operand 0 with sizes 3 and 4"),
    (("ij,ij->ij", (2, 3), (3, 3)), mg.ShapeError, "has size 3 in operand 1, which does not broadcast"),
    (("ij->ii", (2, 3)), mg.ArgumentError, "output subscript i appears more than once"),
    (("ij->k", (2, 3)), mg.ArgumentError, "output subscript k appears in no input"),
    (("i.j", (2, 3)), mg.ArgumentError, "not part of an ellipsis"),
    (("i...j...", (2, 3)), mg.ArgumentError, "more than one ellipsis"),
    (("i1", (3,)), mg.ArgumentError, r"invalid subscript '1' in operand 0"),
    (("i->->", (3,)), mg.ArgumentError, r"invalid subscript '-' in the output"),
])
def test_bad_equations_name_the_equation_the_shapes_and_the_line(args, kind, match):
    equation, *shapes = args
    with pytest.raises(kind, match=match) as error:
        mg.einsum(equation, *[mg.ones(*shape) for shape in shapes])
    assert str(error.value).startswith("einsum: ") and "test_einsum.py" in str(error.value)


def test_bad_operands():
    with pytest.raises(mg.DTypeError, match="same dtype, got float32 .operand 0. and float64"):
        mg.einsum("ij,jk", mg.ones(2, 3), mg.ones(3, 4, dtype=mg.float64))
    with pytest.raises(mg.DTypeError, match="bool"):
        mg.einsum("i->", mg.ones(3, dtype=mg.bool))
    with pytest.raises(mg.ArgumentError, match="at least one operand"):
        mg.einsum("->")
    with pytest.raises(mg.ArgumentError, match=r"integers in \[0, 52\)"):
        mg.einsum(mg.ones(3), [52])


def _kernels(tensor):
    return [step.kernel.name for step in schedule(pending_graph([tensor.node]))]


def test_a_contraction_is_the_kernel_matmul_builds():
    a, b = mg.rand(64, 96), mg.rand(96, 48)
    assert _kernels(mg.einsum("ij,jk->ik", a, b)) == _kernels(a @ b)
    q, k = mg.rand(2, 4, 32, 16), mg.rand(2, 4, 32, 16)
    assert _kernels(mg.einsum("bhld,bhmd->bhlm", q, k)) == _kernels(q @ k.transpose(-1, -2))


def test_the_cheapest_pair_is_contracted_first():
    """(64, 2) @ (2, 64) @ (64, 2): right to left makes a (2, 2) intermediate, not (64, 64)."""
    a, b, c = mg.rand(64, 2), mg.rand(2, 64), mg.rand(64, 2)
    result = mg.einsum("ij,jk,kl->il", a, b, c)
    shapes, stack = set(), [result.node]
    while stack:
        node = stack.pop()
        shapes.add(node.shape)
        stack.extend(node.inputs)
    assert (2, 2) in shapes and (64, 64) not in shapes
    np.testing.assert_allclose(result.numpy(), a.numpy() @ b.numpy() @ c.numpy(), rtol=1e-5)
