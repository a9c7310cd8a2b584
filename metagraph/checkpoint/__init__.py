"""The checkpoint formats behind mg.save and mg.load (metagraph/serialization.py).

names.py      the globals of PyTorch's pickles that metagraph stands in for, and CheckpointError
tensors.py    storages and tensors as a pickle describes them, checked before any view is made
unpickler.py  the allow-listed unpickler both formats read through
archive.py    PyTorch's zip format (torch.save since 1.6, and mg.save): reading and writing
legacy.py     PyTorch's legacy format (torch.save(..., _use_new_zipfile_serialization=False))
"""
