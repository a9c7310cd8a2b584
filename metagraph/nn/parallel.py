"""DistributedDataParallel: one model trained by every rank of metagraph.distributed, each rank on
its own share of every batch, with PyTorch's DDP habits.

How gradients reach the all-reduce in a lazy graph. `loss.backward()` computes nothing: it builds
the gradient nodes, and values are computed at the next sync point. PyTorch's DDP starts a
bucket's all-reduce from autograd hooks as soon as the bucket's gradients exist; here they exist
only once computed, and computing each bucket on its own would compute the gradients of the
activations that later buckets also need once per bucket (the graph keeps no buffer for them).
So at each forward pass (outside `no_sync()`) the wrapper puts the parameters' current graph
nodes in one gradient group (`ops.autograd.GradGroup`), whose hook the backward walk calls once
the last parameter's gradient node is built. The hook computes every gradient in one
realisation (forward and backward, fused as they would be without DDP; running statistics
updated in place are computed with them), copies them into flat buckets of at most 25 MiB (the
first 1 MiB; parameters in reverse order, about the order backward finishes them, as PyTorch
buckets them), divides each by the world size and sums each bucket over the ranks with one
all-reduce, in bucket order, the first bucket as soon as it is copied. Each parameter's gradient
becomes a view of its bucket, which `loss.backward()` stores in `.grad` (and `mg.grad` returns,
so Jittor's `optimizer.step(loss)` averages too); the optimizer's step is then a second
realisation. A bucket is reused at the next step when no gradient of it is still referenced.

Buffers (BatchNorm's running statistics) are broadcast from rank 0 at wrap time and, with
broadcast_buffers (the default), before every forward pass that will be reduced, as PyTorch's;
a BatchNorm layer normalises with the statistics of its own rank's batch (SyncBatchNorm, which
would share them, is not provided).
"""
import contextlib
import sys
import time
import zlib

import numpy as np

from metagraph import backend
from metagraph.distributed.collectives import reduce_buffers
from metagraph.distributed.group import DistributedError, current_world, record
from metagraph.errors import ArgumentError, Unsupported
from metagraph.nn.module import Module
from metagraph.ops.autograd import GradGroup
from metagraph.ops.node import GradMode, Node
from metagraph.tensor import Tensor

FIRST_BUCKET_BYTES = 1 << 20        # PyTorch's first bucket: small, so that communication starts early
BUCKET_BYTES = 25 << 20             # PyTorch's default bucket_cap_mb
ALIGNMENT = 64                      # bytes: each gradient view starts on a cache line


class _Bucket:
    """Parameters whose gradients travel in one all-reduce: their positions in the wrapper's list of
    trained parameters, each one's element range in the flat buffer, and the buffer itself."""

    def __init__(self, dtype):
        self.dtype, self.members, self.ranges, self.size, self.flat = dtype, [], [], 0, None

    def _start(self):
        """Where the next member starts: the first element after the last one on a cache line."""
        return -(-self.size * self.dtype.itemsize // ALIGNMENT) * ALIGNMENT // self.dtype.itemsize

    def fits(self, numel, cap):
        """Whether a member of numel elements keeps the bucket within cap bytes."""
        return (self._start() + numel) * self.dtype.itemsize <= cap

    def add(self, position, numel):
        start = self._start()
        self.members.append(position)
        self.ranges.append((start, start + numel))
        self.size = start + numel

    def buffer(self):
        """The flat buffer, zeroed where no gradient goes. The previous step's is reused unless a
        gradient that views it is still referenced (a Tensor's value never changes under it)."""
        if self.flat is None or sys.getrefcount(self.flat) > 2:    # this attribute and the call
            self.flat = np.zeros(self.size, self.dtype.np)
        return self.flat


def make_buckets(parameters, first_bytes=FIRST_BUCKET_BYTES, bucket_bytes=BUCKET_BYTES):
    """Buckets of `parameters` (positions into it), in reverse order, one dtype per bucket, each
    of at most bucket_bytes (the first first_bytes) unless a single parameter is larger."""
    buckets, open_buckets = [], {}
    for position in reversed(range(len(parameters))):
        p = parameters[position]
        bucket = open_buckets.get(p.dtype)
        cap = first_bytes if bucket is not None and bucket is buckets[0] else bucket_bytes
        if bucket is not None and not bucket.fits(p.numel(), cap):
            bucket = None
        if bucket is None:
            bucket = open_buckets[p.dtype] = _Bucket(p.dtype)
            buckets.append(bucket)
        bucket.add(position, p.numel())
    return buckets


class _ReducerGroup(GradGroup):
    """The gradient group of a DistributedDataParallel's parameters (told apart from others')."""
    __slots__ = ()


class DistributedDataParallel(Module):
    """Wrap `module` so that training it on every rank trains one model: parameters and buffers
    are broadcast from rank 0 now, and every backward pass averages the gradients over the ranks
    (see the module's docstring for how, given the lazy graph). forward passes through;
    `.module` is the wrapped model; state_dict keys start with "module.", as PyTorch's.

    find_unused_parameters: allow parameters that get no gradient on some ranks (one more small
    all-reduce per step says which ranks used which). bucket_cap_mb: the bucket size (25).
    broadcast_buffers: broadcast buffers from rank 0 before each forward pass. device_ids,
    output_device, dim, check_reduction, gradient_as_bucket_view and static_graph are accepted
    for PyTorch's sake: everything lives on the host, and gradients always are views of their
    bucket."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__()
        if not isinstance(module, Module):
            raise ArgumentError(f"DistributedDataParallel: expected an nn.Module, got "
                                f"{type(module).__name__}")
        if device_ids or output_device not in (None, "cpu") or dim != 0:
            raise ArgumentError("DistributedDataParallel: device_ids, output_device and dim place a model on "
                                "accelerators; metagraph's models live on the host (leave them unset)")
        if bucket_cap_mb is not None and bucket_cap_mb <= 0:
            raise ArgumentError(f"DistributedDataParallel: bucket_cap_mb must be positive, got "
                                f"{bucket_cap_mb}")
        self.module = module
        self.world = current_world("DistributedDataParallel", process_group)
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        names = {id(p): name for name, p in module.named_parameters()}
        self._trained = [p for p in module.parameters() if p.requires_grad]
        self._names = [names[id(p)] for p in self._trained]
        if not self._trained:
            raise ArgumentError("DistributedDataParallel: the module has no parameter that requires a "
                                "gradient, so there is nothing to average")
        self._local_gradients = False       # .grad holds unreduced sums from no_sync() passes
        self._verify_same_model()
        self._broadcast(list(module.parameters()) + list(module.buffers()))
        self._cap = BUCKET_BYTES if bucket_cap_mb is None else int(bucket_cap_mb * 2 ** 20)
        self._layout, self._buckets = None, []
        self._make_buckets()

    def _make_buckets(self):
        """Bucket the parameters, again if their dtypes or shapes changed since (`ddp.double()`)."""
        layout = [(p.dtype, p.shape) for p in self._trained]
        if layout != self._layout:
            self._layout = layout
            self._buckets = make_buckets(self._trained, min(FIRST_BUCKET_BYTES, self._cap), self._cap)

    def forward(self, *inputs, **kwargs):
        """The wrapped module's forward; when gradients are recorded outside no_sync(), the backward
        pass through its result will average the parameters' gradients over the ranks."""
        if GradMode.enabled and self.require_backward_grad_sync:
            if self.broadcast_buffers:
                self._broadcast(list(self.module.buffers()))
            nodes = [p.node for p in self._trained]
            for node, name in zip(nodes, self._names):
                if node.grad_group is not None and not isinstance(node.grad_group, _ReducerGroup):
                    raise Unsupported(f"DistributedDataParallel: parameter {name} already has a gradient "
                                      "group of its own (a module backward hook on it)")
            _ReducerGroup(nodes, self._reduce)
        elif GradMode.enabled:
            for p in self._trained:
                if isinstance(p.node.grad_group, _ReducerGroup):
                    p.node.grad_group = None
            self._local_gradients = True
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside the block, forward and backward passes accumulate gradients on each rank without
        communicating; the first backward pass after it averages the accumulated gradients."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # ---- the reduction ---------------------------------------------------------------------------
    def _reduce(self, grads):
        """The gradient group's hook: every parameter's gradient node (None where the walk does not
        reach it) -> the averaged gradients, as views of their buckets."""
        grads = list(grads)
        if any(g is not None and g.requires_grad for g in grads):
            raise Unsupported("DistributedDataParallel: gradients with create_graph=True (double backward) "
                              "cannot be averaged: they would lose their graph")
        reached = [g is not None for g in grads]
        if not all(reached) and not self.find_unused_parameters:
            missing = [name for name, got in zip(self._names, reached) if not got]
            raise DistributedError(f"DistributedDataParallel: rank {self.world.rank}: parameter(s) "
                                   f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} got no "
                                   "gradient in this backward pass, so the ranks cannot average it; pass "
                                   "find_unused_parameters=True when some parameters are not used in every "
                                   "forward pass")
        local = self._with_local_gradients(grads)
        backend.realize([g for g in local if g is not None])    # forward and backward, in one realisation
        used = self._used_anywhere(local) if self.find_unused_parameters else None
        averaged = self._average(local)
        replaced = []
        for position, p in enumerate(self._trained):
            if reached[position]:
                replaced.append(averaged[position])
                continue
            replaced.append(None)
            if used is not None and used[position]:      # another rank's gradient reaches it
                value = Tensor(averaged[position])
                p.grad = value if p.grad is None else p.grad + value
        return replaced

    def _average(self, local):
        """The computed gradients `local` (None: zeros) averaged over the ranks, one all-reduce per
        bucket, as buffer nodes viewing the buckets."""
        averaged = [None] * len(local)
        self._make_buckets()
        for bucket in self._buckets:
            flat = bucket.buffer()
            for position, (start, stop) in zip(bucket.members, bucket.ranges):
                if local[position] is None:
                    flat[start:stop] = 0
                else:       # copied and divided by the world size in one pass
                    np.divide(local[position].buffer.reshape(-1), self.world.size, out=flat[start:stop])
            begun = time.perf_counter()
            reduce_buffers(self.world, flat, flat, "sum")
            record("all_reduce (DDP bucket)", flat.nbytes, begun)
            for position, (start, stop) in zip(bucket.members, bucket.ranges):
                p = self._trained[position]
                averaged[position] = Node("buffer", (), {}, p.shape, p.dtype, requires_grad=False,
                                          buffer=flat[start:stop].reshape(p.shape))
        return averaged

    def _with_local_gradients(self, grads):
        """The gradients to reduce: this pass's, plus what no_sync() passes left in .grad (which then
        starts again from the averaged sum)."""
        if not self._local_gradients:
            return grads
        self._local_gradients = False
        local = []
        for grad, p in zip(grads, self._trained):
            if p.grad is not None:
                grad = p.grad.node if grad is None else p.grad.node + grad
                p.grad = None
            local.append(grad)
        return local

    def _used_anywhere(self, local):
        """Which parameters some rank computed a gradient for (one small all-reduce)."""
        used = np.array([g is not None for g in local], np.uint8)
        begun = time.perf_counter()
        reduce_buffers(self.world, used, used, "max")
        record("all_reduce (DDP unused parameters)", used.nbytes, begun)
        return used.astype(bool)

    # ---- state shared from rank 0 ------------------------------------------------------------------
    def _broadcast(self, tensors):
        """Give every rank rank 0's values of `tensors` (one broadcast per dtype)."""
        if self.world.size == 1 or not tensors:
            return
        backend.realize([t.node for t in tensors])
        by_dtype = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype, group in by_dtype.items():
            flat = np.empty(sum(t.numel() for t in group), dtype.np)
            offsets = np.cumsum([0] + [t.numel() for t in group])
            if self.world.rank == 0:
                for t, start, stop in zip(group, offsets, offsets[1:]):
                    np.copyto(flat[start:stop], t.numpy().reshape(-1))
            begun = time.perf_counter()
            self.world.broadcast(flat.view(np.uint8), 0)
            record("broadcast (DDP state)", flat.nbytes, begun)
            if self.world.rank != 0:
                for t, start, stop in zip(group, offsets, offsets[1:]):
                    t.assign(Tensor(Node("buffer", (), {}, t.shape, t.dtype, requires_grad=False,
                                         buffer=flat[start:stop].reshape(t.shape))))

    def _verify_same_model(self):
        """Raise the same DistributedError on every rank unless every rank wraps a model with the same
        parameter and buffer names, shapes and dtypes (compared through a checksum)."""
        if self.world.size == 1:
            return
        named = list(self.module.named_parameters()) + list(self.module.named_buffers())
        text = ";".join(f"{name}:{t.dtype.name}{t.shape}" for name, t in named)
        mine = np.array([len(list(self.module.parameters())), len(named), sum(t.numel() for _, t in named),
                         zlib.crc32(text.encode())], np.int64)
        everyone = np.empty((self.world.size, mine.size), np.int64)
        self.world.allgather(mine, everyone)
        if (everyone == mine).all():
            return
        ranks = "; ".join(f"rank {rank}: {row[0]} parameters, {row[1] - row[0]} buffers, {row[2]} elements"
                          for rank, row in enumerate(everyone))
        raise DistributedError(f"DistributedDataParallel: the ranks wrap different models ({ranks}; or the "
                               "same counts with other names, shapes or dtypes); every rank must build the "
                               "same model")

    def extra_repr(self):
        return f"world_size={self.world.size}, buckets={len(self._buckets)}"
