"""The client under real CUDA semantics, on the adversarial FAKE runtime (issue 17).

Each test here is a defect a kind fake could not show: work that lands
only when its stream is synchronized, producers on their own streams and
threads, several devices, memory the server still has open, readers that
are still reading.  tritonshm runs on the fake (``fake_cuda``) and so does
a real Triton server (``fake_cuda_server``, the fake ``LD_PRELOAD``-ed).
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading

import numpy as np
import pytest

import tritonshm
from tritonshm import triton
from tritonshm.errors import RegistrationError

from triton_fixtures import client_url, sample


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    return client_url(fake_cuda_server, protocol)


def device_array(data: np.ndarray):
    """*data* copied into fresh (fake) device memory: a CudaArray holding its region."""
    with tritonshm.CudaRegion.create(max(1, data.nbytes)) as region:
        region.write(np.ascontiguousarray(data))
        return region.view(data.dtype, data.shape)


def registered_cuda_names(server) -> set[str]:
    with tritonshm.Client(server.grpc_url) as probe:
        return set(tritonshm.status(probe.tritonclient, kind="cuda"))


# -- 8. CUDA slots are 256-byte aligned ---------------------------------------------------------

def test_every_tensor_of_a_cuda_slot_is_256_byte_aligned(url):
    """cudaMalloc gives 256-byte alignment and Triton's device kernels assume it of every buffer."""
    with tritonshm.Client(url) as c:
        with c.request("add_sub", device="cuda:0") as req:  # two inputs of 64 bytes each
            pointers = [view.ptr for view in req.inputs.values()]
            assert all(ptr % 256 == 0 for ptr in pointers), [hex(p) for p in pointers]
            assert sorted(pointers)[1] - sorted(pointers)[0] == 256


# -- 4. memory the server has open is never freed under it ---------------------------------------

def test_close_waits_for_a_request_in_flight_on_another_thread(url, fake_cuda_server, fake_cuda):
    """close() while a device request runs (the server reading our CUDA slot for 500 ms): the
    request finishes with the right answer, then the memory is unregistered and freed."""
    data = sample(np.float32, 256)
    c = tritonshm.Client(url)
    c.infer("slow_fp32", {"INPUT0": device_array(data)})  # pool made and registered
    order = []
    started = threading.Event()

    def run():
        started.set()
        out = c.infer("slow_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get()
        order.append("request done")
        return out

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(run)
        started.wait()
        while not c.pools()[0].running:  # the request holds its slot: it is in flight
            threading.Event().wait(0.001)
        c.close()
        order.append("close returned")
        np.testing.assert_array_equal(future.result(), data)
    assert order == ["request done", "close returned"]
    assert not registered_cuda_names(fake_cuda_server) & {n for n in c._parked}
    gc.collect()


def test_a_refused_unregistration_keeps_device_memory_for_the_server(url, fake_cuda, monkeypatch):
    """close() while the server refuses to unregister a CUDA extent (it may still be reading it):
    the memory is held for the life of the process, never freed under the server."""
    from fake_cuda import KIND_ALLOC
    from tritonshm.client._client import _held_for_the_server

    data = sample(np.float32, 64)
    c = tritonshm.Client(url)
    c.infer("identity_fp32", {"INPUT0": device_array(data)})
    (name,) = c.pools()[0].regions
    real_unregister = triton.unregister

    def unregister(client, what):
        if what == name:
            raise RegistrationError(f"failed to unregister '{name}': currently in use")
        return real_unregister(client, what)

    monkeypatch.setattr(triton, "unregister", unregister)
    c.close()
    gc.collect()
    (extent,) = [e for e in _held_for_the_server if e.name == name]
    assert fake_cuda.pointer_kind(extent.memory.region.ptr) == KIND_ALLOC  # still allocated
    # Clean up for the leak check, as the server letting go would allow.
    _held_for_the_server.remove(extent)
    with tritonshm.Client(url) as helper:
        real_unregister(helper.tritonclient, name)
    extent.memory.close()


def test_refused_device_memory_is_retried_by_later_requests(url, fake_cuda, monkeypatch):
    """A retired CUDA extent whose unregistration was refused is parked, still allocated, and
    retried after later requests: freed once the server lets go."""
    from fake_cuda import KIND_ALLOC, KIND_UNKNOWN

    c = tritonshm.Client(url, slots=1)
    try:
        small = sample(np.float32, 16)
        c.infer("identity_fp32", {"INPUT0": device_array(small)})
        (old,) = c.pools()[0].regions
        real_unregister = triton.unregister
        refusals = []

        def unregister(client, what):
            if what == old and not refusals:
                refusals.append(what)
                raise RegistrationError(f"failed to unregister '{what}': currently in use")
            return real_unregister(client, what)

        monkeypatch.setattr(triton, "unregister", unregister)
        big = sample(np.float32, 1 << 16)
        c.infer("identity_fp32", {"INPUT0": device_array(big)})  # a larger pool replaces the first
        assert refusals == [old]
        (parked,) = c._parked
        ptr = parked.memory.region.ptr
        assert parked.name == old and fake_cuda.pointer_kind(ptr) == KIND_ALLOC
        c.infer("identity_fp32", {"INPUT0": device_array(small)})  # retried: goes through now
        gc.collect()
        assert c._parked == [] and fake_cuda.pointer_kind(ptr) == KIND_UNKNOWN
    finally:
        c.close()


def test_a_copy_mode_lease_keeps_its_device_memory_while_it_runs(fake_cuda):
    """A request that copies its results out holds no view of its slot; its lease still keeps the
    device memory alive, so an extent closed under it is freed only when the request is over."""
    from fake_cuda import KIND_ALLOC, KIND_UNKNOWN
    from tritonshm.client._model import ModelInfo
    from tritonshm.client._pool import Layout, SlotPool
    from tritonshm.client._slots import CudaSlotMemory

    info = ModelInfo.__new__(ModelInfo)
    pool = SlotPool(info, Layout.for_capacities({"x": 1024}), 2, 1 << 20, CudaSlotMemory)
    extent = pool.new_extent()
    pool.add_extent(extent)
    ptr = extent.memory.region.ptr
    lease = pool.try_acquire(hold=False)
    for dropped in pool.close():   # the client closing under the request
        dropped.memory.close()
    gc.collect()
    assert fake_cuda.pointer_kind(ptr) == KIND_ALLOC
    pool.finished_and_back(lease)
    del lease
    gc.collect()
    assert fake_cuda.pointer_kind(ptr) == KIND_UNKNOWN
