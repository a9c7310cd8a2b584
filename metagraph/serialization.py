"""mg.save and mg.load: state dicts (and dicts, lists and tuples of tensors, numbers and strings) in
PyTorch's checkpoint format, so weights go both ways without PyTorch installed.

mg.save writes PyTorch's zip format (data.pkl, whose tensors are torch._utils._rebuild_tensor_v2
over storage records, and the raw bytes of each), which torch.load(path, weights_only=True) reads.
It writes a temporary file that it renames, so an interrupted save leaves no half-written file.

mg.load reads that format (and what mg.save wrote before it wrote PyTorch's), and PyTorch's legacy
format (torch.save(..., _use_new_zipfile_serialization=False)). A checkpoint is untrusted input:
pickles are read through an allow-list (OrderedDict, and PyTorch's tensor-rebuilding functions,
storage classes and dtypes), so a malicious file cannot run code, and every offset, size, stride
and element count in one is checked against the bytes the file holds before any tensor is made.
What cannot be loaded (a damaged file, dtypes metagraph lacks such as complex and float8,
quantized tensors, pickled modules) is a CheckpointError naming the file. The formats are in
metagraph/checkpoint/."""
import os
import secrets

from metagraph.checkpoint import archive, legacy
from metagraph.checkpoint.names import CheckpointError, refuse

__all__ = ["CheckpointError", "load", "save"]


def load(path):
    """The object in the checkpoint at `path`, written by mg.save or torch.save (either format)."""
    with open(path, "rb") as file:
        try:
            is_zip = file.read(4) == b"PK\x03\x04"
            file.seek(0)
            return archive.read(file, path) if is_zip else legacy.read(file, path)
        except CheckpointError:
            raise
        except RecursionError:
            refuse(path, "nests its containers too deeply")
        except Exception as error:      # whatever the damaged bytes made zipfile or pickle raise
            refuse(path, f"is damaged ({type(error).__name__}: {error})")


def save(obj, path):
    """Write obj (tensors, numbers, strings, None, and dicts, lists and tuples of them, such as a
    state dict) to `path` in PyTorch's zip format, atomically; torch.load reads it too."""
    pickled, arrays = archive.encode(obj)
    directory = os.path.dirname(os.path.abspath(path))
    # Not tempfile.mkstemp: its files are private (0600), and the rename would keep that.
    temporary = os.path.join(directory, f".tmp-{secrets.token_hex(8)}.ckpt")
    try:
        with open(temporary, "xb") as file:
            archive.write(file, pickled, arrays)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
