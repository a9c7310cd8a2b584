"""The `opencl` device as PyTorch users write devices: values moved there with .to() stay in its
memory between kernels and come back with .numpy(), .item() or .cpu(); an op whose operands are
on two devices is an error naming both; models move with Module.to; ResNet-18's inference and
training step match the numpy oracle there; a training loop moves only its batch and its loss.
Skipped, with the reason, where no OpenCL platform exists."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import dtypes
from metagraph.runtime.opencl import DeviceArray
from tests.backends.conftest import compare
from tests.backends.test_rows_and_models import SmallNet
from tests.helpers import needs
from tests.ops.test_special import CREATED_ON_A_DEVICE

ERROR_WORDS_BYTES = 16      # read once per realisation that ran a kernel with a run-time check


@pytest.fixture(autouse=True)
def opencl():
    needs("opencl")


DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int8", "uint8", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_go_to_the_device_and_come_back_unchanged(dtype):
    rng = np.random.default_rng(0)
    array = np.abs(rng.standard_normal((3, 5)) * 50).astype(dtypes.as_dtype(dtype).np)
    x = mg.tensor(array).to("opencl")
    assert x.device == "opencl" and str(x.device) == "opencl"
    assert isinstance(x.node.buffer, DeviceArray)
    np.testing.assert_array_equal(x.numpy(), array)
    back = x.cpu()
    assert back.device == "cpu" and isinstance(back.node.buffer, np.ndarray)
    np.testing.assert_array_equal(back.numpy(), array)
    assert x.to("opencl") is x and back.to(mg.device("cpu")) is back


def test_values_stay_on_the_device_between_kernels():
    x = mg.tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).to("opencl")
    with mg.profile() as prof:
        y = (x * 2).relu().sync()
        total = (y @ x.T).sum().sync()
    assert prof.transfer_bytes == 0 and prof.launches >= 2
    assert isinstance(y.node.buffer, DeviceArray) and isinstance(total.node.buffer, DeviceArray)
    with mg.profile() as prof:
        value = total.item()
    assert prof.transfer_bytes == 4
    grid = np.arange(12.0).reshape(3, 4)
    assert value == pytest.approx(float((grid * 2 @ grid.T).sum()))


def test_a_value_computed_on_the_device_moves_to_the_cpu_when_a_cpu_graph_reads_it():
    x = mg.tensor([1.0, -2.0, 3.0])
    doubled_there = (x.to("opencl") * 2).cpu()       # a copy of a value not computed yet
    assert doubled_there.device == "cpu"
    np.testing.assert_array_equal((doubled_there + 1).numpy(), [3.0, -3.0, 7.0])


@pytest.mark.parametrize("create", CREATED_ON_A_DEVICE)
def test_creation_functions_make_their_values_on_the_device(create):
    mg.manual_seed(3)
    want = create("cpu").numpy()
    mg.manual_seed(3)
    got = create("opencl")
    assert got.device == "opencl"
    np.testing.assert_array_equal(got.numpy(), want)


def test_like_functions_follow_the_tensor_they_are_like():
    x = mg.ones(2, 3, device="opencl")
    made = [mg.zeros_like(x), mg.full_like(x, 2.0), mg.rand_like(x), x.new_zeros(4), x.new_tensor([1.0])]
    for made in made:
        assert made.device == "opencl"
    assert mg.zeros_like(x, device="cpu").device == "cpu"
    leaf = mg.zeros(3, device="opencl", requires_grad=True)
    assert leaf.is_leaf and leaf.requires_grad and leaf.device == "opencl"


def test_an_op_on_two_devices_is_an_error_naming_both_where_it_is_built():
    on_cpu, on_device = mg.ones(2, 3) + mg.tensor([1.0, 2.0, 3.0]), mg.tensor([1.0, 2.0, 3.0]).to("opencl")
    with pytest.raises(mg.DeviceError, match=r"add: its operands are on different devices, cpu and opencl.*"
                                             r"test_devices.py:\d+"):
        on_cpu + on_device
    with pytest.raises(mg.DeviceError, match="matmul: .* opencl and cpu"):
        on_device.reshape(3, 1) @ mg.tensor([[1.0, 2.0]])
    with pytest.raises(mg.DeviceError, match="conv2d"):
        F.conv2d(mg.randn(1, 1, 4, 4, device="opencl"), mg.randn(1, 1, 3, 3))


def test_a_number_and_a_constant_go_with_any_device():
    x = mg.tensor([1.0, 2.0]).to("opencl")
    scaled = x * mg.tensor(3.0) + mg.zeros(2) + 1       # a 0-d tensor and a constant, as PyTorch takes them
    assert scaled.device == "opencl"
    np.testing.assert_array_equal(scaled.numpy(), [4.0, 7.0])


def test_gradients_flow_back_through_a_move():
    x = mg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = mg.tensor([0.5, 4.0, -1.0]).to("opencl")
    loss = (x.to("opencl") * w).sum()
    loss.backward()
    assert x.grad.device == "cpu"
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 4.0, -1.0])
    z = mg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    ((z * z).to("opencl") * w).sum().backward()        # the move of a value not computed yet
    np.testing.assert_array_equal(z.grad.numpy(), [1.0, -16.0, -6.0])


def test_run_time_errors_on_the_device_name_the_op_and_the_index():
    x = mg.randn(4, 3, device="opencl")
    index = mg.tensor([[0], [7]]).to("opencl")
    with pytest.raises(mg.IndexOutOfRange, match="gather.*7"):
        x.gather(0, index).numpy()
    np.testing.assert_array_equal(x.gather(0, mg.tensor([[3]], device="opencl")).numpy(), x.numpy()[3:, :1])


def test_module_to_moves_its_parameters_in_place():
    mg.manual_seed(0)
    model = SmallNet()
    parameters = list(model.parameters())
    optimizer = mg.optim.SGD(model.parameters(), lr=0.1)
    assert model.to("opencl") is model
    assert list(model.parameters()) == parameters
    assert all(p.device == "opencl" and p.is_leaf and p.requires_grad for p in parameters)
    assert all(b.device == "opencl" for b in model.buffers())
    loss = model(mg.randn(2, 1, 8, 8, device="opencl")).sum()
    loss.backward()
    optimizer.step()
    assert all(p.grad.device == "opencl" and p.device == "opencl" for p in parameters)
    model.cpu()
    assert all(p.device == "cpu" for p in model.parameters())


def _batch():
    rng = np.random.default_rng(1)
    return (mg.tensor(rng.standard_normal((2, 3, 32, 32)).astype(np.float32)),
            mg.tensor(rng.integers(0, 10, 2)))


def test_resnet18_inference_on_the_device_matches_the_oracle():
    mg.manual_seed(0)
    model = mg.models.resnet18(num_classes=10).eval()
    for name, buffer in model.named_buffers():       # running statistics that are not 0 and 1
        if buffer.dtype == mg.float32:
            buffer.assign(mg.tensor(np.random.default_rng(len(name)).uniform(0.5, 1.5, buffer.shape)
                                    .astype(np.float32)))
    x, _ = _batch()
    mg.set_backend("numpy")
    with mg.no_grad():
        want = model(x).numpy()
        got = model.to("opencl")(x.to("opencl"))
    assert got.device == "opencl"
    compare(got.numpy(), want, mg.float32)


def _sgd_step(model, device, x, y):
    """The loss, then every parameter and statistic after one SGD step with momentum on `device`."""
    model.to(device)
    optimizer = mg.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    optimizer.step()
    return [loss.numpy()] + [v.numpy().copy() for v in model.state_dict().values()]


def test_a_resnet18_training_step_on_the_device_matches_the_oracle():
    """With the batch norms' statistics frozen (eval mode, as in fine-tuning): normalising over a
    batch of 2 at the last layers' 1x1 planes is so ill-conditioned that the c backend's gradients
    differ from the oracle's by 80% there."""
    import copy
    mg.manual_seed(0)
    model = mg.models.resnet18(num_classes=10).eval()
    x, y = _batch()
    mg.set_backend("numpy")
    want = _sgd_step(copy.deepcopy(model), "cpu", x, y)
    got = _sgd_step(model, "opencl", x, y)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        compare(g, w, dtypes.as_dtype(w.dtype))


def test_a_training_loop_moves_only_its_batch_and_its_loss():
    mg.manual_seed(0)
    model = SmallNet().to("opencl")
    optimizer = mg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    rng = np.random.default_rng(0)
    moved = []
    for step in range(4):
        x = mg.tensor(rng.standard_normal((6, 1, 8, 8)).astype(np.float32))
        y = mg.tensor(rng.integers(0, 10, 6))
        with mg.profile() as prof:
            loss = F.cross_entropy(model(x.to("opencl")), y.to("opencl"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        up = sum(e.args["bytes"] for e in prof.events if e.category == "transfer" and e.name == "to_device")
        down = sum(e.args["bytes"] for e in prof.events if e.category == "transfer" and e.name == "to_host")
        assert up + down == prof.transfer_bytes
        moved.append((up, down))
    batch = 6 * 1 * 8 * 8 * 4 + 6 * 8
    # the first steps also copy the hyperparameters (0-d tensors, once per value) and make the error words
    assert moved[2:] == [(batch, 4 + ERROR_WORDS_BYTES)] * 2
    assert all(up <= batch + 64 for up, _ in moved[:2])


def test_a_device_without_float64_refuses_the_kernels_that_need_it():
    import types

    from metagraph.codegen import opencl
    from metagraph.compiler.graph import pending_graph
    from metagraph.compiler.lower import schedule
    device = mg.backend._instance("opencl").generator.device
    without = types.SimpleNamespace(fp64=False, name="a device without cl_khr_fp64",
                                    compute_units=device.compute_units, max_group=device.max_group)

    def kernels(dtype):
        value = mg.tensor([1.0, 2.0, 3.0], dtype=dtype).exp() * 2
        return [step.kernel for step in schedule(pending_graph([value.node]))]
    assert "double" not in opencl.render(kernels(mg.float32), without)
    with pytest.raises(mg.Unsupported, match=r"compute in float64.*no cl_khr_fp64"):
        opencl.render(kernels(mg.float64), without)
