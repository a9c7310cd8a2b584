"""The executor's buffer pool: a large array is reused once nothing refers to it, never before."""
import threading

import numpy as np

import metagraph as mg
from metagraph.runtime import pool
from metagraph.runtime.pool import POOLED_MIN, Pool

COUNT = POOLED_MIN // 4       # float32 elements of the smallest pooled array


def _address(array):
    return array.__array_interface__["data"][0]


def test_a_dropped_array_is_handed_out_again():
    pool = Pool()
    first = pool.take((COUNT,), np.float32, slack=128)
    address = _address(first)
    del first
    again = pool.take((4, COUNT // 4), np.int32, slack=128)
    assert _address(again) == address and again.dtype == np.int32 and again.shape == (4, COUNT // 4)
    assert pool.held == COUNT * 4 + 128


def test_the_slack_past_an_array_is_zero_and_kept_apart_by_size():
    pool = Pool()
    first = pool.take((COUNT,), np.float32, slack=128)
    assert first.base.nbytes == first.nbytes + 128 and not first.base[first.nbytes:].any()
    address = first.ctypes.data
    del first
    again = pool.take((COUNT,), np.float32, slack=128)     # the same memory; kernels never write
    assert again.ctypes.data == address and pool.held == again.base.nbytes    # the slack: zero still
    assert not again.base[again.nbytes:].any()
    del again
    other = pool.take((COUNT + 32,), np.float32, slack=0)  # as many bytes, but without slack:
    assert other.ctypes.data != address                    # never handed a smaller slack
    assert pool.held == 2 * other.nbytes


def test_an_array_a_view_still_reads_is_never_handed_out():
    pool = Pool()
    first = pool.take((COUNT,), np.float32)
    kept = first[10:20].reshape(2, 5)       # a view keeps the memory in use: it leaves the pool
    kept[:] = 7
    del first
    second = pool.take((COUNT,), np.float32)
    second[:] = 0
    assert (kept == 7).all() and pool.held == COUNT * 4


def test_many_live_arrays_do_not_slow_a_take():
    pool = Pool()
    live = [pool.take((COUNT,), np.float32) for _ in range(200)]
    del live[-1]
    again = pool.take((COUNT,), np.float32)
    assert pool.held == 200 * COUNT * 4 and again.shape == (COUNT,)
    assert sum(len(r) for r in pool.returned.values()) == 0


def test_small_arrays_and_arrays_past_the_limit_are_not_pooled():
    pool = Pool(limit=3 * COUNT * 4)
    assert pool.take((16,), np.float32).shape == (16,) and pool.held == 0
    a, b = pool.take((2 * COUNT,), np.float32), pool.take((2 * COUNT,), np.float32)
    assert pool.held == 2 * COUNT * 4 and b.shape == (2 * COUNT,)
    del a
    c = pool.take((2 * COUNT - 256,), np.float32)     # another size: the free array makes room
    assert pool.held == (2 * COUNT - 256) * 4 and c.shape == (2 * COUNT - 256,)


def test_results_kept_by_the_user_survive_later_runs():
    x = mg.tensor(np.arange(2 * COUNT, dtype=np.float32))
    kept = [(x + k).numpy() for k in range(4)]
    for _ in range(3):
        (x * 0).numpy()
    for k, array in enumerate(kept):
        np.testing.assert_array_equal(array, np.arange(2 * COUNT, dtype=np.float32) + k)


def test_empty_cache_releases_what_no_one_uses():
    from metagraph.runtime.executor import POOL
    x = mg.tensor(np.ones(3 * COUNT, dtype=np.float32))
    kept = (x * 2).numpy()
    (x + 1).numpy()
    alive = (x * 3)
    alive.numpy()
    mg.empty_cache()
    assert POOL.held == sum(len(b) * n for (n, _), b in POOL.arrays.items()) >= alive.numpy().nbytes
    assert not any(POOL.returned.values())
    assert (kept == 2).all() and (alive.numpy() == 3).all()


def test_the_profile_reports_what_the_pool_holds():
    x = mg.tensor(np.ones(3 * COUNT, dtype=np.float32))
    with mg.profile() as prof:
        kept = x * 2
        kept.numpy()
        (x + 1).numpy()                      # its buffer goes back to the pool: free
    nbytes = x.numpy().nbytes
    assert prof.pool_bytes >= prof.pool_free_bytes + nbytes and prof.pool_free_bytes >= nbytes
    assert "buffer pool" in prof.table()
    mg.empty_cache()
    with mg.profile() as prof:
        pass
    assert prof.pool_free_bytes == 0 and prof.pool_bytes >= nbytes       # `kept` is still in use


def test_threads_that_realise_at_once_never_share_an_array():
    x = mg.tensor(np.arange(2 * COUNT, dtype=np.float32))
    want = np.arange(2 * COUNT, dtype=np.float32)
    failures = []

    def work(k):
        for _ in range(30):
            got = (x * float(k)).numpy()
            if not np.array_equal(got, want * k):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in (2, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_sizes_no_realisation_takes_any_more_go_back_to_the_system():
    """A loop over batch sizes frees each size's buffers after it: the free arrays of a size not
    taken during the last KEPT_GENERATIONS realisations are released at the next sweep, while a
    size taken at every realisation (a training loop's) stays."""
    p = Pool()
    steady = (POOLED_MIN * 2,)
    for generation in range(40):
        kept = p.take(steady, np.uint8)
        passing = p.take((POOLED_MIN + 64 * generation,), np.uint8)     # a new size each time
        del kept, passing
        p.age()
    sizes = {nbytes for nbytes, _ in p.arrays}
    assert POOLED_MIN * 2 in sizes                                         # the steady size stays
    assert len(sizes) <= 1 + pool.SWEEP_EVERY + pool.KEPT_GENERATIONS      # old sizes went back
    assert p.held <= (2 + pool.SWEEP_EVERY + pool.KEPT_GENERATIONS) * POOLED_MIN * 2


def test_a_size_one_realisation_takes_goes_back_after_the_next(monkeypatch):
    """A loop over batch sizes takes each size once: its free arrays are released after the next
    realisation, so the pool holds the last sizes' only; a size that realisations a few apart take
    (a training step's: forward, backward, update) turns durable at its second take, and from then
    on is handed out again from the same array, step after step."""
    p = Pool()
    for generation in range(30):
        passing = p.take((POOLED_MIN + 64 * generation,), np.uint8)
        del passing
        p.age()
    assert len(p.arrays) <= 2 and p.held <= 2 * (POOLED_MIN + 64 * 30)
    made = []
    monkeypatch.setattr(pool, "_zero_tailed", lambda nbytes, slack, make=pool._zero_tailed: made.append(nbytes)
                        or make(nbytes, slack))
    for step in range(6):
        for phase in range(3):                    # three realisations a step, a size of its own each
            array = p.take((POOLED_MIN * (2 + phase),), np.uint8)
            del array
            p.age()
    assert sorted(made) == sorted([POOLED_MIN * (2 + phase) for phase in range(3)] * 2)   # steps 1 and 2
    assert {(POOLED_MIN * (2 + phase), 0) for phase in range(3)} <= p.durable
