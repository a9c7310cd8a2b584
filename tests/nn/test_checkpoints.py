"""Checkpoints: mg.save and mg.load in PyTorch's formats (zip and legacy), both ways, and damaged or
malicious files refused with a CheckpointError naming the file.

Crafted files are pickled here with stand-ins (_rebuild_tensor_v2, FloatStorage ...) that
torch_pickle renames to torch's globals, so these tests need no torch; the ones that compare with
files torch itself writes or reads skip without it."""
import io
import os
import pickle
import pickletools
import stat
import struct
import tarfile
import zipfile
from collections import OrderedDict

import ml_dtypes  # noqa: F401  (numpy knows the name "bfloat16" once it is imported)
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn
from metagraph.serialization import CheckpointError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FOUR_FLOATS = np.arange(4, dtype=np.float32).tobytes()
LEGACY_MAGIC, LEGACY_PROTOCOL = 0x1950A86A20F9469CFC6C, 1001
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _rebuild_tensor_v2(*args):
    """Stand-in for torch._utils._rebuild_tensor_v2 (renamed by torch_pickle)."""


def _rebuild_qtensor(*args):
    """Stand-in for torch._utils._rebuild_qtensor."""


class FloatStorage:
    """Stand-in for torch.FloatStorage (renamed by torch_pickle)."""


class BFloat16Storage:
    """Stand-in for torch.BFloat16Storage."""


class BoolStorage:
    """Stand-in for torch.BoolStorage."""


class Storage:
    """A storage reference, pickled as torch's persistent id (with the legacy format's view field)."""

    def __init__(self, kind=FloatStorage, key="0", numel=4, legacy=False):
        self.pid = ("storage", kind, key, "cpu", numel) + ((None,) if legacy else ())


class Tensor:
    """Pickled as torch pickles a tensor; `state` adds a BUILD opcode after it."""

    def __init__(self, storage, offset, size, stride, state=None):
        self.args = (storage, offset, size, stride, False, OrderedDict())
        self.state = state

    def __reduce__(self):
        return (_rebuild_tensor_v2, self.args) + (() if self.state is None else (self.state,))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, Storage) else None


def torch_pickle(obj):
    """obj pickled as torch.save pickles, the stand-ins renamed to torch's globals."""
    stream = io.BytesIO()
    _Pickler(stream, protocol=2).dump(obj)
    here = f"c{__name__}\n".encode()
    pickled = stream.getvalue().replace(here + b"_rebuild", b"ctorch._utils\n_rebuild")
    return pickled.replace(here, b"ctorch\n")


def write_zip(path, pickled, records, folder="archive"):
    """A zip checkpoint: `pickled` as data.pkl, records {key: bytes} as data/<key>."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{folder}/data.pkl", pickled)
        for key, data in records.items():
            archive.writestr(f"{folder}/data/{key}", data)
    return path


def write_legacy(path, pickled, records):
    """A legacy checkpoint: the header pickles, `pickled`, the keys, then each record's count and bytes."""
    header = {"protocol_version": LEGACY_PROTOCOL, "little_endian": True,
              "type_sizes": {"short": 2, "int": 4, "long": 4}}
    parts = [pickle.dumps(value, protocol=2) for value in (LEGACY_MAGIC, LEGACY_PROTOCOL, header)]
    parts += [pickled, pickle.dumps(list(records), protocol=2)]
    for numel, data in records.values():
        parts += [struct.pack("<q", numel), data]
    path.write_bytes(b"".join(parts))
    return path


def assert_same(loaded, expected):
    """Exactly equal: container types, tensor shapes, dtypes and values."""
    assert type(loaded) is type(expected)
    if isinstance(expected, mg.Tensor):
        assert loaded.shape == expected.shape and loaded.dtype == expected.dtype
        np.testing.assert_array_equal(loaded.numpy(), expected.numpy())
    elif isinstance(expected, dict):
        assert list(loaded) == list(expected)
        for key in expected:
            assert_same(loaded[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(loaded) == len(expected)
        for got, want in zip(loaded, expected):
            assert_same(got, want)
    else:
        assert loaded == expected


def torch_name(dtype):
    """torch.float32 -> 'float32'."""
    return str(dtype).removeprefix("torch.")


def torch_values(tensor):
    """A torch tensor's values as numpy holds them (numpy's bfloat16 is ml_dtypes', not torch's)."""
    if str(tensor.dtype) == "torch.bfloat16":
        return tensor.view(__import__("torch").int16).numpy().view(mg.bfloat16.np)
    return tensor.numpy()


def every_dtype_state():
    """A state with a tensor of every dtype, 0-d tensors, a non-contiguous one and nested containers."""
    values = np.arange(-3, 3).reshape(2, 3)
    state = OrderedDict((name, mg.tensor(values.astype(name))) for name in DTYPES)
    state["zero_d"] = mg.tensor(7)
    state["zero_d_float"] = mg.tensor(np.float32(2.5))
    state["transposed"] = mg.tensor(values.astype(np.float32)).t()
    state["empty"] = mg.zeros(0, 3)
    state["nested"] = {"epoch": 3, "lrs": [0.1, 0.01], "name": "run", "none": None, "flag": True,
                       "pair": (mg.tensor([1.5]), 2)}
    return state


# Defect 1: a checkpoint's sizes are checked before any view is made.

@pytest.mark.parametrize("offset, size, stride", [
    (0, (1 << 22,), (1,)),          # far past the storage: crashed the process
    (0, (2,), (1 << 40,)),          # a stride far past it: crashed the process
    (0, (64,), (1,)),               # just past it: returned heap memory
    (3, (2,), (1,)),                # the offset pushes the last element out
    (0, (2, 3), (3, 1)),
    (-1, (2,), (1,)),
    (0, (-1,), (1,)),
    (3, (2,), (-1,)),
    (0, (2.0,), (1,)),
    ("0", (2,), (1,)),
    (0, (2, 2), (1,)),              # a stride per dimension
    (0, (1 << 62, 1 << 62), (0, 0)),  # in bounds, but no memory holds it
    (0, 5, 1),
])
def test_a_tensor_beyond_its_storage_is_refused(tmp_path, offset, size, stride):
    path = write_zip(tmp_path / "bad.pth", torch_pickle({"w": Tensor(Storage(), offset, size, stride)}),
                     {"0": FOUR_FLOATS})
    with pytest.raises(CheckpointError, match=r"bad\.pth holds a tensor \['w'\]"):
        mg.load(path)


def test_views_within_the_storage_load(tmp_path):
    storage = Storage()
    state = {"tail": Tensor(storage, 1, (3,), (1,)), "columns": Tensor(storage, 0, (2, 2), (1, 2)),
             "broadcast": Tensor(storage, 3, (2, 2), (0, 0)), "empty": Tensor(storage, 9, (0, 5), (1, 1)),
             "scalar": Tensor(storage, 2, (), ())}
    loaded = mg.load(write_zip(tmp_path / "views.pth", torch_pickle(state), {"0": FOUR_FLOATS}))
    values = np.arange(4, dtype=np.float32)
    expected = {"tail": values[1:], "columns": values.reshape(2, 2).T, "broadcast": np.full((2, 2), 3.0),
                "empty": np.zeros((0, 5)), "scalar": np.float32(2)}
    for key, want in expected.items():
        assert loaded[key].shape == np.shape(want) and loaded[key].dtype == mg.float32
        np.testing.assert_array_equal(loaded[key].numpy(), want)


@pytest.mark.parametrize("numel, data, problem", [
    (4, FOUR_FLOATS * 2, "holds 32 bytes for storage '0'"),
    (4, FOUR_FLOATS[:12], "holds 12 bytes for storage '0'"),
    (-1, FOUR_FLOATS, "names a storage"),
    ("4", FOUR_FLOATS, "names a storage"),
    (4, None, "lacks the data of storage '0'"),
], ids=["too long", "too short", "negative count", "string count", "missing"])
def test_a_storage_must_hold_the_bytes_its_pickle_declares(tmp_path, numel, data, problem):
    pickled = torch_pickle({"w": Tensor(Storage(numel=numel), 0, (2,), (1,))})
    path = write_zip(tmp_path / "bad.pth", pickled, {} if data is None else {"0": data})
    with pytest.raises(CheckpointError, match=f"bad.pth {problem}"):
        mg.load(path)


def test_a_storage_is_one_size_and_one_type(tmp_path):
    state = {"a": Tensor(Storage(numel=2), 0, (2,), (1,)), "b": Tensor(Storage(numel=4), 0, (4,), (1,))}
    with pytest.raises(CheckpointError, match="names storage '0' both as 2 float32 elements and as 4"):
        mg.load(write_zip(tmp_path / "bad.pth", torch_pickle(state), {"0": FOUR_FLOATS}))


def test_a_pickle_cannot_rewrite_a_checked_tensor(tmp_path):
    # BUILD would set the attributes of what _rebuild_tensor_v2 returned.
    tensor = Tensor(Storage(), 0, (2,), (1,), state={"size": (1 << 22,)})
    with pytest.raises(CheckpointError, match="bad.pth is damaged .*tried to modify tensor over storage"):
        mg.load(write_zip(tmp_path / "bad.pth", torch_pickle({"w": tensor}), {"0": FOUR_FLOATS}))


def test_bool_storages_hold_only_true_and_false(tmp_path):
    pickled = torch_pickle({"b": Tensor(Storage(BoolStorage, numel=3), 0, (3,), (1,))})
    loaded = mg.load(write_zip(tmp_path / "bool.pth", pickled, {"0": bytes([0, 1, 2])}))
    assert loaded["b"].dtype == mg.bool and loaded["b"].numpy().view(np.uint8).tolist() == [0, 1, 1]


def test_big_endian_checkpoints_load(tmp_path):
    path = write_zip(tmp_path / "big.pth", torch_pickle({"w": Tensor(Storage(), 0, (4,), (1,))}),
                     {"0": np.arange(4, dtype=">f4").tobytes()})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("archive/byteorder", b"big")
    assert mg.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_bare_storages_and_deep_nests_are_refused(tmp_path):
    path = write_zip(tmp_path / "bare.pth", torch_pickle({"s": Storage()}), {"0": FOUR_FLOATS})
    with pytest.raises(CheckpointError, match=r"bare.pth holds storage '0' at \['s'\]"):
        mg.load(path)
    depth = 100_000        # lists in lists, built by opcodes (pickle.dumps itself would recurse)
    path = write_zip(tmp_path / "deep.pth", b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".", {})
    with pytest.raises(CheckpointError, match="deep.pth nests its containers too deeply"):
        mg.load(path)


def _flip_first_data_byte(path):
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("archive/data/0")
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra)] ^= 0xFF
    path.write_bytes(bytes(data))


def _break_a_utf8_name(path):
    path.write_bytes(path.read_bytes().replace("ä".encode(), b"\xff\xfe"))


@pytest.mark.parametrize("damage", ["crc", "utf8 name", "truncated", "no directory"])
def test_a_damaged_zip_is_a_checkpoint_error(tmp_path, damage):
    path = tmp_path / "damaged.pth"
    mg.save({"w": mg.arange(8.0)}, path)
    if damage == "crc":
        _flip_first_data_byte(path)
    elif damage == "utf8 name":
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr("archive/ä", b"")
        _break_a_utf8_name(path)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    else:
        path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="damaged.pth is damaged"):
        mg.load(path)


def test_malicious_pickle_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    path = tmp_path / "evil.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": Evil()}, protocol=2))
    with pytest.raises(CheckpointError, match="evil.pth asks for (posix|os).system, which is not on the "
                                              "allow-list"):
        mg.load(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "junk.pth"
    path.write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(CheckpointError, match="junk.pth is not a checkpoint"):
        mg.load(path)


# Defect 2: a state dict comes back exactly, and every model in the zoo loads its own checkpoint.

def test_round_trip_is_exact(tmp_path):
    state = every_dtype_state()
    mg.save(state, tmp_path / "ckpt.pth")
    assert_same(mg.load(tmp_path / "ckpt.pth"), state)


# Every family of the zoo; of the VGGs only vgg11_bn (the others are its layers repeated, or without
# BatchNorm): a VGG takes 7 s to build and writes 530 MB (120M classifier parameters).
@pytest.mark.parametrize("name", ["alexnet", "vgg11_bn", "resnet18", "resnet34", "resnet50",
                                  "resnet101", "resnet152", "mobilenet_v2", "gpt"])
def test_zoo_state_dict_round_trips_into_load_state_dict(tmp_path, name):
    model = getattr(mg.models, name)() if name == "gpt" else getattr(mg.models, name)(num_classes=10)
    state = model.state_dict()
    mg.save(state, tmp_path / "model.pth")
    loaded = mg.load(tmp_path / "model.pth")
    assert_same(loaded, state)
    model.load_state_dict(loaded)


def test_batchnorm_model_round_trips_into_load_state_dict(tmp_path):
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 2),
                        nn.BatchNorm1d(2))
    mg.save(net.state_dict(), tmp_path / "bn.pth")
    loaded = mg.load(tmp_path / "bn.pth")
    assert loaded["1.num_batches_tracked"].shape == () and loaded["1.num_batches_tracked"].dtype == mg.int64
    net.load_state_dict(loaded)


# Defect 3: dtypes metagraph lacks are refused as such, naming the file, the tensor and the dtype.

def test_bfloat16_storages_load_little_and_big_endian(tmp_path):
    bits = np.array([0x3F80, 0xC040, 0x7F80], np.uint16)          # 1, -3, inf
    pickled = torch_pickle({"w": Tensor(Storage(BFloat16Storage, numel=3), 0, (3,), (1,))})
    loaded = mg.load(write_zip(tmp_path / "bf.pth", pickled, {"0": bits.astype("<u2").tobytes()}))["w"]
    assert loaded.dtype == mg.bfloat16
    np.testing.assert_array_equal(loaded.numpy().astype(np.float32), [1.0, -3.0, np.inf])
    path = write_zip(tmp_path / "big.pth", pickled, {"0": bits.astype(">u2").tobytes()})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("archive/byteorder", b"big")
    np.testing.assert_array_equal(mg.load(path)["w"].numpy().astype(np.float32), [1.0, -3.0, np.inf])
    with pytest.raises(CheckpointError, match=r"bf.pth .*6 bytes"):
        mg.load(write_zip(tmp_path / "bf.pth", pickled, {"0": bytes(4)}))


def test_every_storage_type_torch_writes_is_handled(tmp_path):
    torch = pytest.importorskip("torch")
    for name in DTYPES:
        tensor = torch.arange(-2, 4).reshape(2, 3).to(getattr(torch, name))
        torch.save({"w": tensor}, tmp_path / "t.pth")
        loaded = mg.load(tmp_path / "t.pth")["w"]
        assert loaded.dtype.name == name and loaded.shape == (2, 3)
        np.testing.assert_array_equal(loaded.numpy(), torch_values(tensor))
    unsupported = {"complex64": "not support", "complex128": "not support",
                   "uint16": "not support", "uint32": "not support", "uint64": "not support",
                   "float8_e4m3fn": "not support"}
    for name, says in unsupported.items():
        torch.save({"w": torch.ones(2).to(getattr(torch, name))}, tmp_path / "t.pth")
        with pytest.raises(CheckpointError, match=rf"t.pth holds a tensor \['w'\] of dtype {name}, which "
                                                  f"metagraph does {says}"):
            mg.load(tmp_path / "t.pth")


def test_quantized_tensors_are_refused_as_such(tmp_path):
    path = write_zip(tmp_path / "q.pth", torch_pickle({"q": (_rebuild_qtensor, ())}), {})
    with pytest.raises(CheckpointError, match=r"q.pth holds quantized tensors \(torch._utils._rebuild_q"):
        mg.load(path)


def test_torch_negative_views_and_parameters_load(tmp_path):
    torch = pytest.importorskip("torch")
    negated = torch.tensor([1 + 2j, 3 - 4j]).conj().imag      # a float view with PyTorch's negative bit
    torch.save({"neg": negated, "p": torch.nn.Parameter(torch.ones(2))}, tmp_path / "t.pth")
    loaded = mg.load(tmp_path / "t.pth")
    assert loaded["neg"].tolist() == [-2.0, 4.0] and loaded["p"].tolist() == [1.0, 1.0]


# Defect 4: the legacy format.

def test_crafted_legacy_checkpoint_loads(tmp_path):
    state = OrderedDict(w=Tensor(Storage(legacy=True), 1, (3,), (1,)),
                        b=Tensor(Storage(BoolStorage, "7", 2, legacy=True), 0, (), ()))
    records = {"0": (4, FOUR_FLOATS), "7": (2, b"\x01\x00")}
    path = write_legacy(tmp_path / "old.pth", torch_pickle(state), records)
    loaded = mg.load(path)
    assert type(loaded) is OrderedDict and loaded["w"].tolist() == [1.0, 2.0, 3.0]
    assert loaded["b"].shape == () and loaded["b"].dtype == mg.bool and loaded["b"].item() is True


@pytest.mark.parametrize("records, problem", [
    ({"0": (5, FOUR_FLOATS)}, "holds 5 elements for storage '0'"),
    ({"0": (4, FOUR_FLOATS[:8])}, "is truncated"),
    ({"1": (4, FOUR_FLOATS)}, "lists storage keys"),
], ids=["count", "truncated", "keys"])
def test_damaged_legacy_checkpoint_is_refused(tmp_path, records, problem):
    pickled = torch_pickle({"w": Tensor(Storage(legacy=True), 0, (4,), (1,))})
    with pytest.raises(CheckpointError, match=f"old.pth {problem}"):
        mg.load(write_legacy(tmp_path / "old.pth", pickled, records))


def test_legacy_tar_checkpoint_is_refused(tmp_path):
    path = tmp_path / "ancient.pth"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(tarfile.TarInfo("pickle"), io.BytesIO())
    with pytest.raises(CheckpointError, match="ancient.pth is a PyTorch checkpoint in the tar format"):
        mg.load(path)


def test_legacy_checkpoint_written_by_torch_loads(tmp_path):
    torch = pytest.importorskip("torch")
    base = torch.arange(-3, 9).reshape(3, 4)
    state = OrderedDict((name, base.to(getattr(torch, name))) for name in DTYPES)
    state.update(zero_d=torch.tensor(5), view=base.float()[1:, 1:3].t(), empty=torch.zeros(0, 2))
    torch.save(state, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    loaded = mg.load(tmp_path / "legacy.pth")
    assert list(loaded) == list(state)
    for key, tensor in state.items():
        assert loaded[key].shape == tuple(tensor.shape) and loaded[key].dtype.name == torch_name(tensor.dtype)
        np.testing.assert_array_equal(loaded[key].numpy(), torch_values(tensor))


# Defect 5: mg.save writes PyTorch's zip format, and mg.load still reads what mg.save wrote before.

def test_saved_checkpoint_has_torch_layout_and_globals(tmp_path):
    mg.save({"w": mg.ones(3), "n": mg.tensor(2)}, tmp_path / "c.pth")
    with zipfile.ZipFile(tmp_path / "c.pth") as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == ["archive/data.pkl", "archive/byteorder",
                                                     "archive/data/0", "archive/data/1", "archive/version"]
        assert archive.read("archive/version") == b"3\n" and archive.read("archive/byteorder") == b"little"
        for info in infos:      # every record starts 64-byte aligned, as torch.save's
            assert (info.header_offset + 30 + len(info.filename) + len(info.extra)) % 64 == 0
        pickled = archive.read("archive/data.pkl")
    globals_ = {arg for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}
    assert globals_ == {"collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage",
                        "torch LongStorage"}


def test_older_metagraph_checkpoints_still_load(tmp_path):
    class OldPickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("metagraph", "float32", (2, 2), "0") if isinstance(obj, np.ndarray) else None

    stream = io.BytesIO()
    OldPickler(stream, protocol=2).dump({"w": np.zeros(4), "epoch": 3})
    path = write_zip(tmp_path / "old.ckpt", stream.getvalue(), {"0": FOUR_FLOATS}, "metagraph_checkpoint")
    loaded = mg.load(path)
    assert loaded["epoch"] == 3 and loaded["w"].tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_torch_loads_what_mg_saves(tmp_path):
    torch = pytest.importorskip("torch")
    state = every_dtype_state()
    mg.save(state, tmp_path / "mg.pth")
    loaded = torch.load(tmp_path / "mg.pth", weights_only=True)
    assert list(loaded) == list(state)
    for key, value in state.items():
        if isinstance(value, mg.Tensor):
            assert tuple(loaded[key].shape) == value.shape
            assert torch_name(loaded[key].dtype) == value.dtype.name
            np.testing.assert_array_equal(torch_values(loaded[key]), value.numpy())
    assert loaded["nested"]["lrs"] == [0.1, 0.01] and loaded["nested"]["pair"][0].tolist() == [1.5]


def test_mg_loads_what_torch_saves(tmp_path):
    torch = pytest.importorskip("torch")
    state = OrderedDict((name, torch.arange(-3, 3).reshape(2, 3).to(getattr(torch, name))) for name in DTYPES)
    state.update(zero_d=torch.tensor(4), transposed=torch.arange(6.0).reshape(2, 3).t(), nested={"k": [1, 2]})
    torch.save(state, tmp_path / "t.pth")
    loaded = mg.load(tmp_path / "t.pth")
    assert list(loaded) == list(state) and loaded["nested"] == {"k": [1, 2]}
    for key, tensor in state.items():
        if isinstance(tensor, torch.Tensor):
            assert loaded[key].shape == tuple(tensor.shape)
            assert loaded[key].dtype.name == torch_name(tensor.dtype)
            np.testing.assert_array_equal(loaded[key].numpy(), torch_values(tensor))


def test_batchnorm_model_saved_by_mg_loads_into_torch(tmp_path):
    torch = pytest.importorskip("torch")
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4, 3))
    net(mg.randn(2, 1, 3, 3))           # training mode: running statistics and the batch count move
    mg.save(net.state_dict(), tmp_path / "bn.pth")
    twin = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4, 3))
    twin.load_state_dict(torch.load(tmp_path / "bn.pth", weights_only=True))
    for key, value in net.state_dict().items():
        np.testing.assert_array_equal(twin.state_dict()[key].numpy(), value.numpy())
    assert twin[1].num_batches_tracked.item() == 1


def test_pytorch_checkpoint_loads_without_pytorch_and_reproduces_its_outputs():
    state = mg.load(os.path.join(FIXTURES, "small_cnn.pth"))
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(64, 10))
    net.load_state_dict(state)
    net.eval()
    io_ = np.load(os.path.join(FIXTURES, "small_cnn_io.npz"))
    np.testing.assert_allclose(net(mg.tensor(io_["x"])).numpy(), io_["y"], rtol=1e-5, atol=1e-5)


def test_save_is_atomic_and_writes_an_ordinary_file(tmp_path):
    mg.save({"w": mg.ones(2)}, tmp_path / "c.pth")
    (tmp_path / "plain").write_bytes(b"")
    modes = [stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in ("c.pth", "plain")]
    assert modes[0] == modes[1]
    with pytest.raises(mg.ArgumentError, match="mg.save: cannot store a numpy.float64"):
        mg.save({"w": mg.ones(2), "score": np.float64(0.5)}, tmp_path / "c.pth")
    assert sorted(os.listdir(tmp_path)) == ["c.pth", "plain"]
    assert mg.load(tmp_path / "c.pth")["w"].tolist() == [1.0, 1.0]
