"""CudaRegion.borrow: another library's allocation, lent to the server without a copy (FAKE runtime).

The torch-like double with a caching allocator carves tensors out of shared
segments, as torch does; borrowing a tensor must find the segment (its base
and size, through cuMemGetAddressRange), take its IPC handle at the base, and
keep the segment from being freed until the region is closed.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tritonshm
from tritonshm import cuda


def test_borrow_finds_the_segment_that_holds_a_small_tensor(torch_caching, fake_cuda):
    first = torch_caching.from_numpy(np.arange(256, dtype=np.float32))
    second = torch_caching.from_numpy(np.arange(256, dtype=np.float32) * 2)
    (segment,) = torch_caching.allocator.segments()
    with tritonshm.CudaRegion.borrow(second) as region:
        assert region.borrowed and not region.owner
        assert (region.ptr, region.nbytes) == segment  # the whole allocation, not the tensor
        offset = second.ptr - region.ptr
        assert offset > 0  # the second block of the segment
        # the IPC handle is the segment's (what the server opens), taken at its base
        assert region.ipc_handle == fake_cuda.ipc_get_handle(segment[0])
        np.testing.assert_array_equal(region.read(np.float32, 256, offset), np.arange(256) * 2)
    del first, second


def test_a_borrowed_region_keeps_its_segment_until_closed(torch_caching, fake_cuda):
    tensor = torch_caching.from_numpy(np.ones(64, np.float32))
    region = tritonshm.CudaRegion.borrow(tensor)
    del tensor
    gc.collect()
    assert torch_caching.empty_cache() == 0  # the region's capture holds the block
    before = fake_cuda.stats()
    region.close()
    gc.collect()
    assert fake_cuda.stats().free_calls == before.free_calls  # closing frees nothing itself
    assert torch_caching.empty_cache() == 1  # the segment is its owner's to free again


def test_a_new_allocation_at_an_old_base_has_a_new_handle(torch_caching, fake_cuda):
    tensor = torch_caching.empty(4 << 20, np.uint8)  # a segment of its own
    with tritonshm.CudaRegion.borrow(tensor) as region:
        base, handle = region.ptr, region.ipc_handle
    del tensor
    gc.collect()
    assert torch_caching.empty_cache() == 1
    again = torch_caching.empty(4 << 20, np.uint8)
    with tritonshm.CudaRegion.borrow(again) as region:
        assert region.ptr == base  # the fake, like CUDA, hands the address out again
        assert region.ipc_handle != handle  # ... for a new allocation, with a new handle
    del again


def test_memory_cuda_ipc_cannot_export_is_not_shareable(torch_expandable, fake_cuda):
    tensor = torch_expandable.from_numpy(np.ones(16, np.float32))
    with pytest.raises(tritonshm.NotShareable, match="expandable segments"):
        tritonshm.CudaRegion.borrow(tensor)
    assert isinstance(tritonshm.NotShareable("x"), tritonshm.UnsupportedBuffer)
    del tensor


@pytest.mark.parametrize("how", ["cudaMallocAsync", "cudaMallocManaged"])
def test_pool_and_managed_memory_are_not_shareable(fake_cuda, how):
    ptr = fake_cuda.malloc_unshareable(4096, how)

    class Cai:
        __cuda_array_interface__ = {"shape": (1024,), "typestr": "<f4", "data": (ptr, False),
                                    "version": 3, "strides": None, "stream": None}
    try:
        with pytest.raises(tritonshm.NotShareable):
            tritonshm.CudaRegion.borrow(Cai())
    finally:
        fake_cuda.free(ptr)


def test_borrowing_our_own_region_names_its_allocation(fake_cuda):
    with tritonshm.CudaRegion.create(1 << 16) as own:
        view = own.view(np.float32, 100, offset=4096)
        with tritonshm.CudaRegion.borrow(view) as lent:
            assert (lent.ptr, lent.nbytes, lent.ipc_handle) == (own.ptr, own.nbytes, own.ipc_handle)
        del view


def test_a_borrowed_region_lends_no_views(torch_caching):
    tensor = torch_caching.from_numpy(np.ones(16, np.float32))
    with tritonshm.CudaRegion.borrow(tensor) as region:
        with pytest.raises(tritonshm.UnsupportedBuffer, match="borrowed"):
            region.view(np.float32, 16)
        with pytest.raises(tritonshm.UnsupportedBuffer, match="borrowed"):
            region.window(0, 64)
        assert "borrowed" in repr(region)
    with pytest.raises(tritonshm.RegionClosed):
        region.read(np.float32, 16)
    del tensor


def test_host_memory_cannot_be_borrowed(fake_cuda):
    with pytest.raises(tritonshm.UnsupportedBuffer):
        tritonshm.CudaRegion.borrow(np.ones(4, np.float32))
    assert cuda.CudaRegion is tritonshm.CudaRegion


# -- a refused export: nothing left on the thread's last error, asked once per allocation ----------

class PoolCai:
    """Raw pool memory (the fake's cudaMallocAsync) seen through the CUDA Array Interface only."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


@pytest.mark.parametrize("memory", ["torch expandable segments", "cupy async pool", "cudaMallocAsync"])
def test_a_refused_export_leaves_no_last_error_for_torch_to_find(request, fake_cuda, torch_like, memory):
    """cudaIpcGetMemHandle refuses the memory (invalid value), which sets the runtime's last error
    on this thread -- the runtime torch loaded too, and torch checks cudaGetLastError() after every
    kernel: on an H200 the caller's next torch op raised "CUDA error: invalid argument".  The
    borrow clears what it expected; the torch-like double's next "kernel" checks as torch does."""
    ptr = None
    if memory == "cudaMallocAsync":
        ptr = fake_cuda.malloc_unshareable(4096)
        array = PoolCai(ptr, 4096)
    else:
        producer = request.getfixturevalue("torch_expandable" if memory.startswith("torch") else "cupy_async_pool")
        array = producer.from_numpy(np.ones(64, np.float32))
    try:
        before = fake_cuda.stats()
        with pytest.raises(tritonshm.NotShareable):
            tritonshm.CudaRegion.borrow(array)
        assert (fake_cuda.stats() - before).ipc_get_refusals == 1  # CUDA was asked, and refused
        assert fake_cuda.peek_last_error() == 0
        x = torch_like.zeros(8, np.float32)  # a kernel launch and its check: must not raise
        np.testing.assert_array_equal(x.numpy(), np.zeros(8, np.float32))
    finally:
        del array
        if ptr is not None:
            fake_cuda.free(ptr)


def test_a_refusal_is_remembered_and_a_new_allocation_at_its_base_is_lent(fake_cuda):
    """The second borrow of a refused allocation asks CUDA nothing (the allocation is known by
    the driver's buffer id); an exportable allocation made later at the same address is a new
    allocation, lent."""
    from tritonshm._memory import _cuda_region

    pool = fake_cuda.malloc_unshareable(4096)
    try:
        before, refusals = fake_cuda.stats(), _cuda_region.export_refusals()
        for _ in range(3):
            with pytest.raises(tritonshm.NotShareable, match="expandable segments"):
                tritonshm.CudaRegion.borrow(PoolCai(pool, 4096))
        assert (fake_cuda.stats() - before).ipc_get_refusals == 1
        assert _cuda_region.export_refusals() == refusals + 1
    finally:
        fake_cuda.free(pool)
    plain = fake_cuda.malloc(4096)
    try:
        assert plain == pool  # the fake, like CUDA, hands the address out again
        with tritonshm.CudaRegion.borrow(PoolCai(plain, 4096)) as region:
            assert region.ptr == plain and region.ipc_handle == fake_cuda.ipc_get_handle(plain)
    finally:
        fake_cuda.free(plain)
    assert fake_cuda.peek_last_error() == 0


def test_without_buffer_ids_a_refusal_is_known_by_base_and_size(fake_cuda, monkeypatch):
    """A driver that gives no CU_POINTER_ATTRIBUTE_BUFFER_ID: the refused allocation is told from a
    later one at its base by its size."""
    monkeypatch.setenv("TSHM_FAKE_CUDA_NO_BUFFER_ID", "1")
    pool = fake_cuda.malloc_unshareable(4096)
    try:
        before = fake_cuda.stats()
        for _ in range(2):
            with pytest.raises(tritonshm.NotShareable):
                tritonshm.CudaRegion.borrow(PoolCai(pool, 4096))
        assert (fake_cuda.stats() - before).ipc_get_refusals == 1
    finally:
        fake_cuda.free(pool)
    plain = fake_cuda.malloc(3000)  # the same pages, another size
    try:
        assert plain == pool
        with tritonshm.CudaRegion.borrow(PoolCai(plain, 3000)) as region:
            assert (region.ptr, region.nbytes) == (plain, 3000)
    finally:
        fake_cuda.free(plain)


def test_the_memory_of_refusals_is_bounded(fake_cuda, monkeypatch):
    """The least recently seen refusal is dropped first: asked again when seen again."""
    from tritonshm._memory import _cuda_region

    monkeypatch.setattr(_cuda_region, "_MAX_REFUSED", 2)
    pools = [fake_cuda.malloc_unshareable(4096) for _ in range(3)]
    try:
        def refusals_of(ptr):
            before = fake_cuda.stats()
            with pytest.raises(tritonshm.NotShareable):
                tritonshm.CudaRegion.borrow(PoolCai(ptr, 4096))
            return (fake_cuda.stats() - before).ipc_get_refusals

        assert [refusals_of(p) for p in pools] == [1, 1, 1]  # the first one is dropped
        assert [refusals_of(p) for p in pools[1:]] == [0, 0]
        assert refusals_of(pools[0]) == 1  # asked again (and pools[1] dropped in its place)
        assert refusals_of(pools[2]) == 0
    finally:
        for p in pools:
            fake_cuda.free(p)
