"""metagraph.utils.data: the data loading API under PyTorch's import path."""
import numpy as np

import metagraph as mg
import metagraph.data
import metagraph.utils.data
from metagraph.utils.data import DataLoader, TensorDataset


def test_every_public_name_of_metagraph_data_is_reexported():
    data = metagraph.data
    public = {name for name, value in vars(data).items()
              if not name.startswith("_") and getattr(value, "__module__", None) == data.__name__}
    assert public and all(getattr(metagraph.utils.data, name) is getattr(data, name) for name in public)


def test_imports_as_in_pytorch_scripts():
    assert mg.utils.data.DataLoader is DataLoader is metagraph.data.DataLoader
    x, y = np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5)
    batches = list(DataLoader(TensorDataset(mg.tensor(x), mg.tensor(y)), batch_size=2))
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[0][0].tolist() == [[0.0, 1.0], [2.0, 3.0]]
