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
