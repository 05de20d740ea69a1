"""CudaArray results from cached blocks (issue 40), on the FAKE runtime: no cudaMalloc/cudaFree per
request, and a block is never handed out again -- nor freed -- while a view of it, a DLPack tensor
made from one, or a consumer's stream reading it lives."""

from __future__ import annotations

import gc

import numpy as np

import tritonshm
from tritonshm.client._devices import Placement, ResultBlocks, empty

from fake_cuda import consume_dlpack


def test_a_block_is_used_again_once_its_result_is_gone(fake_cuda):
    blocks = ResultBlocks()
    first = blocks.empty(np.dtype(np.float32), (1000,), 0)
    ptr = first.ptr
    before = fake_cuda.stats()
    second = blocks.empty(np.dtype(np.float32), (1000,), 0)  # the first still lives: another block
    assert second.ptr != ptr and (fake_cuda.stats() - before).malloc_calls == 1
    del first
    before = fake_cuda.stats()
    third = blocks.empty(np.dtype(np.int32), (900,), 0)  # same size class: the first's block again
    assert third.ptr == ptr
    assert (fake_cuda.stats() - before).malloc_calls == 0
    assert blocks.stats() == (2, 2 * 4096)
    del second, third
    blocks.clear()
    gc.collect()
    assert fake_cuda.stats().live_allocs == before.live_allocs - 2  # freed once the cache let go


def test_a_block_is_kept_while_a_dlpack_tensor_or_its_reader_lives(fake_cuda, torch_like):
    blocks = ResultBlocks()
    result = blocks.empty(np.dtype(np.float32), (256,), 0)
    ptr = result.ptr
    with torch_like.stream(0) as side:
        consumer = torch_like.from_dlpack(result)  # a torch tensor of the result, on a side stream
        del result
        assert blocks.empty(np.dtype(np.float32), (256,), 0).ptr != ptr  # the tensor holds it
        fake_cuda.kernel_write(side, consumer.ptr, b"\0" * 4)  # the consumer still reads/writes it ...
        del consumer  # ... when it lets go: its stream is a reader until that work is done
        gc.collect()
        other = blocks.empty(np.dtype(np.float32), (256,), 0)
        assert other.ptr != ptr  # not while the side stream's work may still touch it
        torch_like.synchronize(0)
        again = blocks.empty(np.dtype(np.float32), (256,), 0)
        assert again.ptr == ptr  # (the first free block of the class: the reader is done)
    del other, again
    blocks.clear(close=True)
    assert blocks.empty(np.dtype(np.float32), (256,), 0) is not None and blocks.stats() == (0, 0)  # closed: uncached
    gc.collect()


def test_a_view_outlives_clear_and_is_freed_when_it_goes(fake_cuda):
    blocks = ResultBlocks()
    result = blocks.empty(np.dtype(np.float32), (64,), 0)
    tritonshm.cuda.copy(result, np.arange(64, dtype=np.float32))
    live = fake_cuda.stats().live_allocs
    blocks.clear()
    gc.collect()
    assert fake_cuda.stats().live_allocs == live  # never freed under a live view
    np.testing.assert_array_equal(result.get(), np.arange(64, dtype=np.float32))
    capsule = result.__dlpack__(stream=-1, max_version=(1, 0))
    ptr, _, deleter = consume_dlpack(capsule)
    del result
    gc.collect()
    assert fake_cuda.stats().live_allocs == live  # the DLPack tensor holds it
    deleter(ptr)
    del capsule
    gc.collect()
    assert fake_cuda.stats().live_allocs == live - 1


def test_size_classes_and_bounds(fake_cuda, monkeypatch):
    from tritonshm.client import _devices

    assert [_devices._block_bytes(n) for n in (0, 1, 512, 513, 1 << 20, (1 << 20) + 1, 5 << 20)] == \
        [512, 512, 512, 1024, 1 << 20, 2 << 20, 6 << 20]
    monkeypatch.setattr(_devices, "_BLOCKS_PER_CLASS", 2)
    blocks = ResultBlocks()
    views = [blocks.empty(np.dtype(np.uint8), (100,), 0) for _ in range(3)]
    assert blocks.stats() == (2, 1024)  # the third result is freed when dropped, not cached
    del views
    blocks.clear()
    gc.collect()


def test_empty_takes_our_arrays_from_the_blocks(fake_cuda):
    blocks = ResultBlocks()
    a = empty(Placement(0), np.dtype(np.float32), (8,), blocks)
    assert isinstance(a, tritonshm.CudaArray) and blocks.stats()[0] == 1
    b = empty(Placement(0), np.dtype(np.float32), (8,))  # no cache given: an allocation of its own
    assert blocks.stats()[0] == 1
    del a, b
    blocks.clear()
    gc.collect()
