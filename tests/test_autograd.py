"""Autograd: backward/grad semantics, leaves, detach, no_grad, accumulation."""
import numpy as np
import pytest

import metagraph as mg


def test_backward_accumulates_into_leaves():
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5, 7])
    assert w.is_leaf and w.grad.requires_grad is False


def test_grad_returns_zeros_for_unused_inputs():
    a = mg.tensor([1.0, 2.0], requires_grad=True)
    b = mg.tensor([3.0], requires_grad=True)
    ga, gb = mg.grad((a * 2).sum(), [a, b])
    np.testing.assert_array_equal(ga.numpy(), [2, 2])
    np.testing.assert_array_equal(gb.numpy(), [0])


def test_grad_with_respect_to_an_intermediate():
    a = mg.tensor([1.0, 2.0], requires_grad=True)
    h = a * 3
    g = mg.grad((h * h).sum(), h)
    np.testing.assert_array_equal(g.numpy(), [6, 12])


def test_non_scalar_backward_needs_a_gradient():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(mg.MetagraphError, match="scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(mg.tensor([1.0, 10.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2, 20])


def test_detach_and_no_grad_cut_history():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x.detach() * x
    g, = mg.grad(y.sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [1, 2])
    with mg.no_grad():
        z = x * 2
    assert not z.requires_grad
    with mg.set_grad_enabled(False):
        with mg.enable_grad():
            assert (x * 2).requires_grad


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point"):
        mg.tensor([1, 2], requires_grad=True)


def test_backward_on_tensor_without_history_is_an_error():
    with pytest.raises(mg.MetagraphError, match="does not require grad"):
        mg.ones(1).sum().backward()


def test_gradient_after_realising_the_forward_value():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    loss = (x.exp() * x).sum()
    loss.item()                       # realised first: the history stays for backward
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1, 2]) * (1 + np.array([1, 2])), rtol=1e-6)


def test_parameter_update_under_no_grad_keeps_a_fresh_leaf():
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3):
        loss = (w * w).sum()
        g, = mg.grad(loss, [w])
        with mg.no_grad():
            w -= g * 0.25
    assert w.is_leaf and w.requires_grad
    np.testing.assert_allclose(w.numpy(), [0.125, 0.25])
    assert w.node.inputs == () or w.node.leaf


def test_data_setter_and_assign_keep_leaf_status():
    w = mg.tensor([1.0], requires_grad=True)
    w.data = w * 2
    assert w.is_leaf and w.requires_grad and w.item() == 2.0
    w.assign(mg.tensor([5.0]))
    assert w.requires_grad and w.item() == 5.0


def test_deep_chain_does_not_hit_the_recursion_limit():
    x = mg.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(3000):
        y = y + 1.0
    g, = mg.grad(y.sum(), [x])
    assert y.item() == 3001.0 and g.item() == 1.0


def test_create_graph_gives_second_derivatives():
    x = mg.tensor([2.0], requires_grad=True)
    g, = mg.grad((x * x * x).sum(), [x], create_graph=True)
    gg, = mg.grad(g.sum(), [x])
    assert g.item() == 12.0 and gg.item() == 12.0


def test_gradient_and_update_nodes_name_the_line_that_built_them():
    import sys
    x = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    loss = (x * x).sum()
    loss.backward(); backward_line = sys._getframe().f_lineno   # noqa: E702  (one line)
    assert x.grad.node.location == (__file__, backward_line)
    optimizer = mg.optim.SGD([x], lr=0.1)
    optimizer.step(); step_line = sys._getframe().f_lineno      # noqa: E702
    assert x.node.location == (__file__, step_line)
    z = x * 3.0; later_line = sys._getframe().f_lineno          # noqa: E702  (its own line again)
    assert z.node.location == (__file__, later_line)


def test_backward_twice_is_an_error_unless_the_graph_is_retained():
    import sys
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    loss.backward()                                  # retained: walked again, gradients add up
    np.testing.assert_array_equal(w.grad.numpy(), [4, 8])
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True") as error:
        line = sys._getframe().f_lineno + 1
        loss.backward()
    assert isinstance(error.value, mg.MetagraphError)
    assert f"test_autograd.py:{line}" in str(error.value)
    np.testing.assert_array_equal(w.grad.numpy(), [4, 8])     # the refused call added nothing


def test_a_graph_shared_by_two_losses_is_released_by_the_first_backward():
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    h = w * w
    (h * 2).sum().backward()
    with pytest.raises(mg.MetagraphError, match="second time"):
        (h * 3).sum().backward()
    h = w * w
    (h * 2).sum().backward(retain_graph=True)
    (h * 3).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4 + 10, 8 + 20])


def test_grad_releases_the_graph_unless_retained_and_create_graph_retains_it():
    x = mg.tensor([2.0], requires_grad=True)
    y = (x * x).sum()
    mg.grad(y, [x], retain_graph=True)
    mg.grad(y, [x])
    with pytest.raises(mg.MetagraphError, match="grad: trying to backward through the graph a second"):
        mg.grad(y, [x])
    y = (x * x * x).sum()
    g, = mg.grad(y, [x], create_graph=True)
    g2, = mg.grad(y, [x])                            # create_graph retained it
    assert g.item() == g2.item() == 12.0


def test_gradient_nodes_record_their_forward_composite_and_the_context_is_restored():
    from metagraph.ops import node as nodes
    x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = mg.nn.functional.softmax(x * 2.0, dim=0)
    grads = mg.grad((y * y).sum(), [x])
    assert nodes._building.get() is None
    walk, names = [grads[0].node], set()
    while walk:
        node = walk.pop()
        if node.composite is not None:
            names.add(node.composite)
        walk.extend(node.inputs)
    assert {"softmax_backward", "mul_backward"} <= names
    assert grads[0].node.location[0] == __file__
