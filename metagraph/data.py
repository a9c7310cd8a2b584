"""Datasets, samplers and a DataLoader, as torch.utils.data (batches are assembled on the host)."""
import collections
import itertools
import threading
from collections.abc import Mapping
from concurrent import futures

import numpy as np

from metagraph import creation
from metagraph.errors import ArgumentError, DTypeError, MetagraphError, ShapeError, fail
from metagraph.ops import movement
from metagraph.random import numpy_generator
from metagraph.tensor import Tensor


class Dataset:
    """Anything with __getitem__ and __len__."""

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class TensorDataset(Dataset):
    """Samples are the index-th rows of equally long tensors or arrays."""

    def __init__(self, *tensors):
        arrays = [t.numpy() if isinstance(t, Tensor) else np.asarray(t) for t in tensors]
        if not arrays or any(len(a) != len(arrays[0]) for a in arrays):
            raise ArgumentError(f"TensorDataset: tensors of different lengths {[len(a) for a in arrays]}")
        self.arrays = arrays

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


class SequentialSampler:
    """The indices of `data_source` in order."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler:
    """The indices of `data_source` in a new random order at each iteration, drawn from `generator`
    (an mg.Generator), else from the generator mg.manual_seed seeds."""

    def __init__(self, data_source, generator=None):
        numpy_generator("RandomSampler", generator)     # a wrong generator fails here, not later
        self.data_source, self.generator = data_source, generator

    def __iter__(self):
        order = numpy_generator("RandomSampler", self.generator).permutation(len(self.data_source))
        return iter(order.tolist())

    def __len__(self):
        return len(self.data_source)


class BatchSampler:
    """Lists of `batch_size` indices taken in turn from `sampler`; a shorter last one unless drop_last."""

    def __init__(self, sampler, batch_size, drop_last):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            fail(ArgumentError, "DataLoader", f"batch_size should be a positive integer, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), drop_last

    def __iter__(self):
        indices = iter(self.sampler)
        while batch := list(itertools.islice(indices, self.batch_size)):
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch

    def __len__(self):
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


def _unsupported(found):
    fail(DTypeError, "default_collate", "batch must contain tensors, numpy arrays, numbers, dicts or "
         f"lists; found {found}")


def _stacked(arrays, dtype=None):
    """One tensor of the equally shaped numpy arrays stacked along a new first dimension."""
    if any(a.shape != arrays[0].shape for a in arrays):
        fail(ShapeError, "default_collate", f"samples of shapes {sorted({a.shape for a in arrays})} "
             "cannot be stacked into one batch")
    if arrays[0].dtype.kind not in "biuf":
        _unsupported(f"arrays of {arrays[0].dtype}")
    return creation.from_numpy_array(np.stack(arrays), dtype)


def default_collate(batch):
    """A list of samples as one batch, as torch.utils.data.default_collate: tensors and numpy arrays
    are stacked, numbers become a tensor (Python floats float64), dicts, named tuples, tuples and
    lists are collated field by field (tuples into lists, as PyTorch's), strings are kept as given."""
    first = batch[0]
    if isinstance(first, Tensor):
        if all(t.node.buffer is not None and not t.requires_grad for t in batch):
            # a host copy, where a lazy stack would compile a kernel per batch size
            return _stacked([t.numpy() for t in batch], first.dtype)
        return Tensor(movement.stack([t.node for t in batch]))
    if isinstance(first, np.ndarray):
        return _stacked([np.asarray(a) for a in batch])
    if isinstance(first, (bool, int, float, np.number, np.bool_)):
        return _stacked([np.asarray(number) for number in batch])
    if isinstance(first, (str, bytes)):
        return batch
    if isinstance(first, Mapping):
        return {key: default_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(sample) != len(first) for sample in batch):
            fail(ShapeError, "default_collate", f"samples of lengths {sorted({len(s) for s in batch})}: "
                 "each element in list of batch should be of equal size")
        fields = [default_collate(field) for field in zip(*batch)]
        return type(first)(*fields) if hasattr(first, "_fields") else fields
    _unsupported(type(first))


def default_convert(sample):
    """A sample as torch.utils.data.default_convert leaves it (batch_size=None): numpy arrays and
    numpy scalars become tensors, also inside dicts, named tuples, tuples and lists (these into
    lists); anything else is kept."""
    numeric_array = isinstance(sample, np.ndarray) and sample.dtype.kind in "biuf"
    if numeric_array or isinstance(sample, (np.number, np.bool_)):
        return creation.tensor(np.asarray(sample))
    if isinstance(sample, Mapping):
        return {key: default_convert(value) for key, value in sample.items()}
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return type(sample)(*map(default_convert, sample))
    if isinstance(sample, (tuple, list)):
        return [default_convert(value) for value in sample]
    return sample


class LoaderTimeout(MetagraphError, RuntimeError):
    """No batch came from the worker threads within the DataLoader's timeout (RuntimeError, as
    PyTorch raises)."""


class _Workers:
    """Worker threads that load batches; each calls worker_init_fn(its id) before its first."""

    def __init__(self, count, worker_init_fn):
        self.pool = futures.ThreadPoolExecutor(count, thread_name_prefix="metagraph-DataLoader")
        self.worker_init_fn, self.ids, self.local = worker_init_fn, itertools.count(), threading.local()

    def submit(self, fetch, index):
        return self.pool.submit(self._run, fetch, index)

    def _run(self, fetch, index):
        if self.worker_init_fn is not None and not hasattr(self.local, "id"):
            self.local.id = next(self.ids)
            self.worker_init_fn(self.local.id)
        return fetch(index)


class DataLoader:
    """Batches of a dataset, as torch.utils.data.DataLoader, with its arguments.

    shuffle draws a new order every epoch from `generator` (an mg.Generator), else from the generator
    mg.manual_seed seeds, so identical runs give identical batches. num_workers > 0 loads batches in
    that many worker threads (not processes: nothing is pickled, the dataset is shared), up to
    num_workers * prefetch_factor batches ahead, yielded in order; threads help where loading waits
    or runs outside the GIL (files, numpy), and a dataset that draws random numbers there draws them
    in the order the threads run. worker_init_fn(worker_id) runs in each thread before its first
    batch; persistent_workers keeps the threads between epochs; timeout bounds the wait for one
    batch. pin_memory has no effect: host memory is the only memory. progress=True (or a label)
    shows a tqdm bar (metagraph's addition).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers=False, progress=False):
        if num_workers < 0:
            fail(ArgumentError, "DataLoader", f"num_workers should be non-negative, got {num_workers}; "
                 "use num_workers=0 to load in the calling thread")
        if timeout < 0:
            fail(ArgumentError, "DataLoader", f"timeout should be non-negative, got {timeout}")
        if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
            fail(ArgumentError, "DataLoader", "prefetch_factor and persistent_workers need worker "
                 "threads (num_workers > 0)")
        if prefetch_factor is not None and prefetch_factor < 1:
            fail(ArgumentError, "DataLoader", f"prefetch_factor should be positive, got {prefetch_factor}")
        if multiprocessing_context is not None:
            fail(ArgumentError, "DataLoader", "multiprocessing_context is not supported: the workers "
                 "are threads, not processes")
        if sampler is not None and shuffle:
            fail(ArgumentError, "DataLoader", "sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            fail(ArgumentError, "DataLoader", "batch_sampler option is mutually exclusive with "
                 "batch_size, shuffle, sampler, and drop_last")
        if batch_size is None and drop_last:
            fail(ArgumentError, "DataLoader", "batch_size=None option disables auto-batching and is "
                 "mutually exclusive with drop_last")
        if sampler is None:
            sampler = RandomSampler(dataset, generator) if shuffle else SequentialSampler(dataset)
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler, self.batch_sampler, self.generator = sampler, batch_sampler, generator
        self.collate_fn = collate_fn or (default_convert if batch_sampler is None else default_collate)
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor or 2
        self.worker_init_fn, self.persistent_workers = worker_init_fn, persistent_workers
        self.pin_memory, self.timeout, self.progress = pin_memory, timeout, progress
        self._workers = None        # kept between epochs when persistent_workers

    def __len__(self):
        return len(self.sampler if self.batch_sampler is None else self.batch_sampler)

    def __iter__(self):
        indices = iter(self.sampler if self.batch_sampler is None else self.batch_sampler)
        batches = map(self._fetch, indices) if self.num_workers == 0 else self._prefetched(indices)
        if not self.progress:
            return batches
        from tqdm import tqdm
        return iter(tqdm(batches, total=len(self), leave=False,
                         desc=self.progress if isinstance(self.progress, str) else None))

    def _fetch(self, index):
        """The batch of a list of indices (a sample, without a batch sampler)."""
        if self.batch_sampler is None:
            return self.collate_fn(self.dataset[index])
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is default_collate:
            rows = np.asarray(index)        # one gather per array: default_collate's result, no loop
            return [creation.tensor(a[rows]) for a in self.dataset.arrays]
        return self.collate_fn([self.dataset[i] for i in index])

    def _prefetched(self, indices):
        """The batches loaded by worker threads, at most num_workers * prefetch_factor ahead, in order."""
        workers = self._workers or _Workers(self.num_workers, self.worker_init_fn)
        if self.persistent_workers:
            self._workers = workers
        pending = collections.deque()
        try:
            for index in indices:
                pending.append(workers.submit(self._fetch, index))
                if len(pending) == self.num_workers * self.prefetch_factor:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for future in pending:
                future.cancel()
            if not self.persistent_workers:
                workers.pool.shutdown(wait=False)

    def _result(self, future):
        try:
            return future.result(timeout=self.timeout or None)
        except futures.TimeoutError:      # not yet the built-in TimeoutError in Python 3.10
            raise LoaderTimeout(f"DataLoader timed out after {self.timeout} seconds waiting for a "
                                "batch from its worker threads") from None


from metagraph.utils.distributed_sampler import DistributedSampler  # noqa: E402,F401  (utils imports this)
