"""GPU tensors through the high-level client, on any machine: the FAKE CUDA runtime.

tritonshm runs on the fake runtime (tests/fake_cudart) and so does a real
Triton server (``fake_cuda_server``: the fake ``LD_PRELOAD``-ed), which
opens our fake CUDA handles: CUDA slot pools, device inputs and results,
held views, chunking, threads, re-registration and clean-up are exercised
against a real server.  Device inputs here are tritonshm's own device views
and an object speaking only the CUDA Array Interface; torch and cupy are in
the ``gpu`` suite (test_client_cuda_gpu.py).  The session's plain server,
with no fake in it, stands in for a server that cannot open our handles.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import tritonshm
from tritonshm.client._slots import SYSTEM, SlotKind  # noqa: F401 (the private pool keys)
import tritonshm.aio
from tritonshm import cuda

from triton_fixtures import client_url, sample
from support.insides import live_pool, wrap_step


def device_array(data: np.ndarray):
    """*data* copied into fresh (fake) device memory: a CudaArray holding its region."""
    with tritonshm.CudaRegion.create(max(1, data.nbytes)) as region:
        region.write(np.ascontiguousarray(data))
        return region.view(data.dtype, data.shape)


class CaiOnly:
    """A device array that speaks only the CUDA Array Interface (like numba's)."""

    def __init__(self, view):
        self._view = view  # keeps the memory
        self.__cuda_array_interface__ = view.__cuda_array_interface__


def pool_of(client, model):
    """The one pool *client* has for *model* (a snapshot: Client.pools())."""
    (pool,) = [p for p in client.pools() if p.model == model]
    return pool


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    return client_url(fake_cuda_server, protocol)


@pytest.mark.parametrize("by_reference", [True, False])
def test_device_input_round_trip_stays_on_the_device(url, fake_cuda, by_reference):
    data = sample(np.float32, 1000)
    tensor = device_array(data)
    with tritonshm.Client(url, by_reference=by_reference) as c:
        c.model_info("identity_fp32")
        before = fake_cuda.stats()
        out = c.infer("identity_fp32", {"INPUT0": tensor})["OUTPUT0"]
        used = fake_cuda.stats() - before
        # by reference: the input's own allocation is registered and named (no copy in); else
        # one copy in (device to device); one copy out into a fresh device array -- all
        # queued on a copy stream (no cudaMemcpy, no legacy-stream or device sync); the
        # pool's extent and the result are the only allocations
        copies = 1 if by_reference else 2
        assert (used.async_copies, used.async_copy_bytes) == (copies, copies * data.nbytes)
        assert (used.memcpy_calls, used.legacy_syncs, used.device_syncs) == (0, 0, 0)
        assert used.malloc_calls == 2
        assert isinstance(out, cuda.CudaArray) and out.device == 0
        np.testing.assert_array_equal(out.get(), data)
        pool = pool_of(c, "identity_fp32")
        assert pool.memory == "cuda:0" and len(pool.regions) == 1  # never through host slots
        assert pool.regions[0].startswith("tritonshm-cuda-")
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.allocations) == ((1, 1, 1) if by_reference
                                                                               else (0, 0, 0))
        del out


def test_cuda_array_interface_input_and_output_device_cpu(url):
    data = sample(np.int32, 64)
    with tritonshm.Client(url) as c:
        out = c.infer("identity_int32", {"INPUT0": CaiOnly(device_array(data))}, output_device="cpu")
        assert isinstance(out["OUTPUT0"], np.ndarray)
        np.testing.assert_array_equal(out["OUTPUT0"], data)


def test_host_input_with_results_on_the_device(url):
    data = sample(np.float32, 256)
    with tritonshm.Client(url) as c:
        out = c.infer("identity_fp32", {"INPUT0": data}, output_device="cuda:0")["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray)
        np.testing.assert_array_equal(out.get(), data)
        assert [p.memory for p in c.pools()] == ["system"]  # host slots, then to the GPU


@pytest.mark.parametrize("dtype, model", [
    (np.float32, "identity_fp32"), (np.float16, "identity_fp16"), (np.int8, "identity_int8"),
    (np.uint8, "identity_uint8"), (np.int32, "identity_int32"), (np.int64, "identity_int64"),
    (np.bool_, "identity_bool"), (ml_dtypes.bfloat16, "identity_bf16"),
])
def test_every_dtype_round_trips(url, dtype, model):
    data = sample(dtype, 333)
    with tritonshm.Client(url) as c:
        out = c.infer(model, {"INPUT0": device_array(data)})["OUTPUT0"]
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.get(), data)


def test_wrong_device_dtype_is_refused_before_sending(url):
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.DTypeMismatch, match="float64"):
            c.infer("identity_fp32", {"INPUT0": device_array(sample(np.float64, 8))})
        with pytest.raises(tritonshm.ShapeMismatch):
            c.infer("batched_fp32", {"INPUT0": device_array(sample(np.float32, 8))})


def test_held_device_results_keep_their_slot_until_every_dlpack_tensor_is_gone(url):
    data = sample(np.float32, 64)
    # (inputs copied into the slot, as lent ones take no room there: the pool's layout stays one)
    with tritonshm.Client(url, slots=1, by_reference=False) as c:
        held = c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]
        capsule = held.__dlpack__()  # what torch.from_dlpack would hold: no Python object of ours
        del held
        gc.collect()
        assert pool_of(c, "identity_fp32").held == 1
        # the next request must not get (and overwrite) the held slot: the pool grows instead
        other = sample(np.float32, 64, seed=1)
        out = c.infer("identity_fp32", {"INPUT0": device_array(other)}, copy=False, slot_timeout=0)["OUTPUT0"]
        np.testing.assert_array_equal(out.get(), other)
        assert len(pool_of(c, "identity_fp32").regions) == 2
        del out, capsule  # the capsule's deleter runs in C and wakes nobody: the pool looks again
        gc.collect()
        assert pool_of(c, "identity_fp32").held == 0


def test_held_device_results_stay_intact_across_later_requests(url):
    with tritonshm.Client(url, slots=2) as c:
        kept = []
        for i in range(6):
            data = sample(np.float32, 128, seed=i)
            kept.append((data, c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]))
        for data, view in kept:
            np.testing.assert_array_equal(view.get(), data)


def test_chunked_device_batch_is_joined_on_the_device(url):
    with tritonshm.Client(url) as c:
        limit = c.model_info("batched_fp32").max_batch_size
        data = sample(np.float32, (limit * 2 + 3) * 4).reshape(limit * 2 + 3, 4)
        out = c.infer("batched_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray) and out.shape == data.shape
        np.testing.assert_array_equal(out.get(), data * 2)  # the model doubles


def test_threads_with_per_request_verification(url):
    with tritonshm.Client(url, slots=2) as c:
        def work(seed):
            for i in range(25):
                data = sample(np.float32, 512, seed=seed * 100 + i)
                out = c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
                np.testing.assert_array_equal(out.get(), data)

        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            list(threads.map(work, range(4)))  # re-raises the first failure


def test_zero_copy_device_request(url):
    data = sample(np.float32, 3 * 4).reshape(3, 4)
    with tritonshm.Client(url) as c:
        with c.request("batched_fp32", batch_size=3, device="cuda:0") as req:
            view = req.inputs["INPUT0"]
            assert isinstance(view, cuda.CudaArray) and view.shape == (3, 4)
            cuda.copy(view, data)  # a preprocessing kernel would write here
            out = req.run()["OUTPUT0"]
            assert isinstance(out, cuda.CudaArray)
            np.testing.assert_array_equal(out.get(), data * 2)  # the model doubles


def test_nothing_is_left_registered_or_allocated(url, fake_cuda_server, fake_cuda):
    before = fake_cuda.stats()
    c = tritonshm.Client(url)
    for i in range(100):
        data = sample(np.float32, 64, seed=i)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)
    names = [name for pool in c.pools() for name in pool.regions]
    with tritonshm.Client(fake_cuda_server.grpc_url) as probe:
        assert set(names) <= set(tritonshm.status(probe.tritonclient, kind="cuda"))
        c.close()
        assert not set(names) & set(tritonshm.status(probe.tritonclient, kind="cuda"))
    gc.collect()
    assert (fake_cuda.stats() - before).live == (0, 0, 0)


def test_reregisters_after_the_server_forgot(url, fake_cuda_server):
    data = sample(np.float32, 32)
    with tritonshm.Client(url) as c:
        c.infer("identity_fp32", {"INPUT0": device_array(data)})
        (name,) = pool_of(c, "identity_fp32").regions
        c.tritonclient.unregister_cuda_shared_memory(name)  # as a restarted server would have
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)


def test_bytes_models_take_device_inputs_through_pinned_host_slots(url):
    with tritonshm.Client(url) as c:
        info = c.model_info("mixed_bytes")
        inputs = {}
        for spec in info.inputs:
            shape = [d if d > 0 else 3 for d in info.shape_of(spec, 2)]
            if spec.is_bytes:
                inputs[spec.name] = np.array([b"x" * (i + 1) for i in range(int(np.prod(shape)))],
                                             dtype=object).reshape(shape)
            else:
                inputs[spec.name] = device_array(sample(spec.dtype, int(np.prod(shape))).reshape(shape))
        out = c.infer("mixed_bytes", inputs)
        assert [p.memory for p in c.pools()] == ["pinned:0"]
        assert set(out) == set(info.output_names)


def test_aio_device_round_trip(url):
    data = sample(np.float32, 100)

    async def scenario():
        async with tritonshm.aio.Client(url) as c:
            out = (await c.infer("identity_fp32", {"INPUT0": device_array(data)}))["OUTPUT0"]
            np.testing.assert_array_equal(out.get(), data)
            req = await c.request("batched_fp32", 2, device="cuda")
            cuda.copy(req.inputs["INPUT0"], sample(np.float32, req.inputs["INPUT0"].size))
            got = (await req.run())["OUTPUT0"]
            np.testing.assert_array_equal(got.get(), req.inputs["INPUT0"].get() * 2)
            req.close()

    asyncio.run(scenario())


# -- a server that cannot open our CUDA memory (no fake inside it) ---------------------------------

def test_auto_falls_back_to_pinned_host_slots_with_one_warning(server, protocol, fake_cuda):
    data = sample(np.float32, 64)
    with tritonshm.Client(client_url(server, protocol)) as c:
        with pytest.warns(RuntimeWarning, match="fall back to pinned system shared memory.*cannot open our CUDA"):
            out = c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray)  # still where the input was
        np.testing.assert_array_equal(out.get(), data)
        (extent,) = live_pool(c, "identity_fp32", SlotKind.pinned(0)).extents
        assert extent.memory.region.pinned
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once only
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)


def test_transport_cuda_raises_instead_of_falling_back(server, fake_cuda):
    with tritonshm.Client(server.grpc_url, transport="cuda") as c:
        with pytest.raises(tritonshm.SharedMemoryRefused, match="cannot open our CUDA memory"):
            c.infer("identity_fp32", {"INPUT0": sample(np.float32, 8)})


def test_device_request_raises_where_cuda_memory_is_refused(server, fake_cuda):
    with tritonshm.Client(server.grpc_url) as c:
        with pytest.raises(tritonshm.SharedMemoryRefused):
            c.request("batched_fp32", 2, device="cuda:0")


def test_wire_transport_carries_device_tensors_too(server, fake_cuda):
    data = sample(np.float32, 50)
    with tritonshm.Client(server.grpc_url, transport="wire") as c:
        out = c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray)
        np.testing.assert_array_equal(out.get(), data)


# -- misuse -----------------------------------------------------------------------------------------

def test_inputs_on_two_gpus_are_refused(url, monkeypatch):
    monkeypatch.setenv("TSHM_FAKE_CUDA_DEVICES", "2")
    with tritonshm.CudaRegion.create(64, device=1) as other:
        with tritonshm.Client(url) as c:
            with pytest.raises(tritonshm.InvalidOption, match="one GPU"):
                c.infer("add_sub", {"INPUT0": device_array(sample(np.float32, 16)),
                                    "INPUT1": other.view(np.float32, 16)})


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", -1, 1.5])
def test_output_device_nonsense_is_refused(url, bad):
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.InvalidOption, match="output_device"):
            c.infer("identity_fp32", {"INPUT0": sample(np.float32, 4)}, output_device=bad)


def test_transport_cuda_needs_cuda(server):
    if cuda.available():
        pytest.skip("CUDA is usable here")
    with pytest.raises(tritonshm.CudaUnavailable, match="transport='cuda'"):
        tritonshm.Client(server.grpc_url, transport="cuda")


def test_ls_shows_cuda_pools_registered_with_the_server(fake_cuda_server, fake_cuda):
    import os
    import subprocess
    import sys

    with tritonshm.Client(fake_cuda_server.grpc_url) as c:
        c.infer("identity_fp32", {"INPUT0": device_array(sample(np.float32, 16))})
        (name,) = pool_of(c, "identity_fp32").regions
        done = subprocess.run([sys.executable, "-m", "tritonshm", "ls", "--url", fake_cuda_server.grpc_url],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith(name))
    assert line.split()[1:5] == ["cuda", "cuda:0", str(os.getpid()), "live"]


class RefusesExport:
    """A DLPack producer that will not export (as torch for a tensor that requires grad)."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, **kwargs):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")


def test_device_inputs_that_cannot_be_shared_get_a_clear_error(url):
    strided = CaiOnly(device_array(sample(np.float32, 16).reshape(4, 4)))
    strided.__cuda_array_interface__ = dict(strided.__cuda_array_interface__, shape=(4, 2), strides=(16, 8))
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.UnsupportedBuffer, match="require gradient"):
            c.infer("identity_fp32", {"INPUT0": RefusesExport()})
        with pytest.raises(tritonshm.UnsupportedBuffer, match="contiguous"):
            c.infer("identity_fp32", {"INPUT0": strided})
        assert c.pools() == []  # refused before anything was made or sent


def test_at_the_byte_cap_a_request_waits_for_a_dlpack_tensor_to_go(url):
    data = sample(np.float32, 64)
    # (inputs copied: these fresh allocations would be lent, then copied as "used once", and
    # the pool's layout grow past the cap meanwhile; slots are what this test is about)
    with tritonshm.Client(url, slots=1, max_pool_bytes=4096, by_reference=False) as c:
        view = c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]
        capsule = view.__dlpack__()
        del view
        with pytest.raises(tritonshm.PoolExhausted, match="byte cap"):
            c.infer("identity_fp32", {"INPUT0": device_array(data)}, slot_timeout=0.05)
        # Nothing wakes the waiter when a DLPack deleter runs (in C, on any thread):
        # the pool looks again every few milliseconds.
        holder = [capsule]
        del capsule
        timer = threading.Timer(0.2, holder.clear)
        timer.start()
        waited = time.monotonic()
        out = c.infer("identity_fp32", {"INPUT0": device_array(data)}, slot_timeout=60)["OUTPUT0"]
        waited = time.monotonic() - waited
        timer.join()
        assert waited < 30  # it was let in when the tensor went, not at its timeout
        np.testing.assert_array_equal(out.get(), data)


def test_device_views_outlive_the_client(url):
    data = sample(np.float32, 64)
    c = tritonshm.Client(url)
    view = c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]
    c.close()
    np.testing.assert_array_equal(view.get(), data)  # the slot's memory lives while the view does


@pytest.mark.server
def test_the_whole_fallback_chain_cuda_then_pinned_then_the_wire(fake_cuda):
    """A server that opens neither our CUDA handles nor our segments (its own /dev/shm)."""
    from tritonshm.server import LocalServer

    from triton_fixtures import start_or_skip

    data = sample(np.float32, 128)
    with start_or_skip(LocalServer(private_shm=True)) as srv:
        with tritonshm.Client(srv.grpc_url) as c:
            with pytest.warns(RuntimeWarning) as caught:
                out = c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
            said = [str(w.message) for w in caught]
            assert len(said) == 2, said
            assert "pinned system shared memory" in said[0] and "cannot open our CUDA" in said[0]
            assert "falling back to plain gRPC" in said[1]
            assert isinstance(out, cuda.CudaArray)  # back on the device it came from
            np.testing.assert_array_equal(out.get(), data)
            assert c.pools() == []
            batch = sample(np.float32, 19 * 4).reshape(19, 4)  # chunks over the wire, rows on the device
            out = c.infer("batched_fp32", {"INPUT0": device_array(batch)})["OUTPUT0"]
            assert isinstance(out, cuda.CudaArray) and out.shape == (19, 4)
            np.testing.assert_array_equal(out.get(), batch * 2)
            host = c.infer("batched_fp32", {"INPUT0": batch})["OUTPUT0"]  # ... and on the host
            np.testing.assert_array_equal(host, batch * 2)


def test_an_empty_device_tensor_round_trips(url):
    with tritonshm.Client(url) as c:
        out = c.infer("identity_fp32", {"INPUT0": device_array(np.empty(0, np.float32))})["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray) and out.shape == (0,)
        limit = c.model_info("batched_fp32").max_batch_size
        data = sample(np.float32, limit * 4 * 2).reshape(limit * 2, 4)
        out = c.infer("batched_fp32", {"INPUT0": device_array(data)}, output_device="cpu")["OUTPUT0"]
        np.testing.assert_array_equal(out, data * 2)  # chunks joined on the host


def test_pools_reports_what_the_client_holds(url):
    data = sample(np.float32, 64)
    with tritonshm.Client(url, slots=2) as c:
        assert c.pools() == []
        view = c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]
        c.infer("identity_fp32", {"INPUT0": data})
        by_memory = {p.memory: p for p in c.pools()}
        assert set(by_memory) == {"cuda:0", "system"}
        gpu = by_memory["cuda:0"]
        assert (gpu.model, gpu.version, gpu.slots, gpu.running, gpu.held) == ("identity_fp32", "", 2, 0, 1)
        assert gpu.nbytes == 2 * gpu.slot_bytes and len(gpu.regions) == 1
        with tritonshm.Client(url) as probe:
            assert gpu.regions[0] in tritonshm.status(probe.tritonclient, kind="cuda")
        del view
        gc.collect()
        assert {p.memory: p.held for p in c.pools()} == {"cuda:0": 0, "system": 0}
    assert c.pools() == []


def test_a_gpu_that_does_not_exist_is_refused_before_sending(url, fake_cuda):
    data = sample(np.float32, 8)
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.InvalidOption, match=r"output_device='cuda:3', but 1 GPU\(s\)"):
            c.infer("identity_fp32", {"INPUT0": data}, output_device="cuda:3")
        with pytest.raises(tritonshm.InvalidOption, match=r"device=2, but 1 GPU"):
            c.request("batched_fp32", 2, device=2)
        assert c.pools() == []


def test_results_on_a_gpu_need_cuda(server):
    if cuda.available():
        pytest.skip("CUDA is usable here")
    with tritonshm.Client(server.grpc_url) as c:
        with pytest.raises(tritonshm.CudaUnavailable, match="output_device='cuda' needs CUDA"):
            c.infer("identity_fp32", {"INPUT0": sample(np.float32, 4)}, output_device="cuda")
        with pytest.raises(tritonshm.CudaUnavailable, match="device='cuda:0' needs CUDA"):
            c.request("batched_fp32", 2, device="cuda:0")


def test_aio_waits_for_a_dlpack_tensor_to_go_at_the_byte_cap(url):
    data = sample(np.float32, 64)

    async def scenario():
        async with tritonshm.aio.Client(url, slots=1, max_pool_bytes=4096, by_reference=False) as c:
            view = (await c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False))["OUTPUT0"]
            holder = [view.__dlpack__()]
            del view
            with pytest.raises(tritonshm.PoolExhausted, match="byte cap"):
                await c.infer("identity_fp32", {"INPUT0": device_array(data)}, slot_timeout=0.05)
            asyncio.get_running_loop().call_later(0.2, holder.clear)  # the tensor goes; nobody is told
            started = time.monotonic()
            out = (await c.infer("identity_fp32", {"INPUT0": device_array(data)}, slot_timeout=60))["OUTPUT0"]
            assert time.monotonic() - started < 30  # let in when the tensor went, not at its timeout
            np.testing.assert_array_equal(out.get(), data)

    asyncio.run(scenario())


@pytest.mark.server
def test_cuda_pools_are_registered_again_after_a_real_server_restart(fake_cudart_path, fake_cuda):
    from tritonshm.server import LocalServer

    from fake_cuda import server_env
    from triton_fixtures import start_or_skip

    data = sample(np.float32, 256)
    with start_or_skip(LocalServer(env=server_env(fake_cudart_path))) as srv:
        with tritonshm.Client(srv.grpc_url, by_reference=False) as c:  # (the slots' path; lent: test_client_lent)
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)
            (before,) = pool_of(c, "identity_fp32").regions
            srv.restart()  # the new server knows none of our regions
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)
            assert pool_of(c, "identity_fp32").regions == (before,)  # the same memory, registered again
            assert before in tritonshm.status(c.tritonclient, kind="cuda")


@pytest.mark.server
def test_cuda_pools_after_a_restart_unable_to_open_our_memory_step_down(fake_cudart_path, fake_cuda):
    """The server restarts as one that cannot open our memory: the request that finds its CUDA slots
    refused as they are registered again fails (SharedMemoryRefused), and from the next on the
    client steps down as at a first refusal -- host slots, refused too here, then the wire -- where
    every request was refused for ever."""
    import warnings

    from tritonshm.server import LocalServer

    from fake_cuda import server_env
    from triton_fixtures import restarted_unable_to_open_our_memory, start_or_skip

    data = sample(np.float32, 256)
    with start_or_skip(LocalServer(env=server_env(fake_cudart_path))) as srv:
        with tritonshm.Client(srv.grpc_url, by_reference=False) as c:
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get(), data)
            with restarted_unable_to_open_our_memory(srv, env=server_env(fake_cudart_path)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # (the steps down, each warned of once)
                    with pytest.raises(tritonshm.SharedMemoryRefused):
                        c.infer("identity_fp32", {"INPUT0": device_array(data)})
                    for _ in range(2):
                        out = c.infer("identity_fp32", {"INPUT0": device_array(data)})["OUTPUT0"]
                        np.testing.assert_array_equal(out.get(), data)
                        del out


@pytest.mark.parametrize("slots_on", ["host", "device"])
def test_chunked_results_are_written_straight_into_their_rows(url, fake_cuda, slots_on):
    batch = sample(np.float32, 21 * 4).reshape(21, 4)  # 3 chunks of max_batch_size 8
    given = batch if slots_on == "host" else device_array(batch)
    with tritonshm.Client(url) as c:
        c.model_info("batched_fp32")
        before = fake_cuda.stats()
        out = c.infer("batched_fp32", {"INPUT0": given}, output_device="cuda")["OUTPUT0"]
        used = fake_cuda.stats() - before
        assert isinstance(out, cuda.CudaArray) and out.shape == (21, 4)
        np.testing.assert_array_equal(out.get(), batch * 2)
        # one result allocation, and each chunk's rows copied once: no per-chunk arrays to join
        # (device chunks are sent by reference: nothing is copied in)
        assert used.async_copies == 3
        assert used.async_copy_bytes == batch.nbytes


@pytest.mark.parametrize("rows", [1, 8, 9, 16, 17, 30])
@pytest.mark.parametrize("given, wanted", [("host", "cpu"), ("host", "cuda"), ("device", "cpu"),
                                           ("device", "cuda")])
def test_chunk_boundaries_every_way(url, rows, given, wanted):
    batch = sample(np.float32, rows * 4, seed=rows).reshape(rows, 4)
    with tritonshm.Client(url, slots=2) as c:
        x = batch if given == "host" else device_array(batch)
        out = c.infer("batched_fp32", {"INPUT0": x}, output_device=wanted)["OUTPUT0"]
        got = out if wanted == "cpu" else out.get()
        assert got.shape == (rows, 4)
        np.testing.assert_array_equal(got, batch * 2)


def test_a_blocked_thread_is_let_in_when_a_held_cuda_slot_comes_free(url):
    """The slot is held by a request, then only by a DLPack tensor, then by nothing:
    a thread waiting at the byte cap must get it then, not at its timeout (60 s)."""
    data = sample(np.float32, 64)
    # (inputs copied: these fresh allocations would be lent, then copied as "used once", and
    # the pool's layout grow past the cap meanwhile; slots are what this test is about)
    with tritonshm.Client(url, slots=1, max_pool_bytes=4096, by_reference=False) as c:
        req = c.request("identity_fp32", shapes={"INPUT0": (64,)}, device="cuda:0")
        cuda.copy(req.inputs["INPUT0"], data)
        out = req.run()["OUTPUT0"]
        holder = [out.__dlpack__()]
        del out
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(lambda: c.infer("identity_fp32", {"INPUT0": device_array(data)},
                                                  slot_timeout=60)["OUTPUT0"].get())
            time.sleep(0.2)
            req.close()  # the request goes; the slot is now held by the DLPack tensor only
            del req
            time.sleep(0.2)
            assert not waiting.done()
            holder.clear()  # the tensor goes: its deleter (in C) tells nobody
            np.testing.assert_array_equal(waiting.result(timeout=30), data)


@pytest.mark.parametrize("driver", ["blocking", "aio"])
def test_concurrent_first_requests_all_fall_back_with_one_warning(server, fake_cuda, driver):
    batch = sample(np.float32, 30 * 4).reshape(30, 4)  # 4 chunks, each the first of its kind
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if driver == "blocking":
            with tritonshm.Client(server.grpc_url, slots=4) as c:
                out = c.infer("batched_fp32", {"INPUT0": device_array(batch)})["OUTPUT0"]
        else:
            async def scenario():
                async with tritonshm.aio.Client(server.grpc_url, slots=4) as c:
                    return (await c.infer("batched_fp32", {"INPUT0": device_array(batch)}))["OUTPUT0"]

            out = asyncio.run(scenario())
    np.testing.assert_array_equal(out.get(), batch * 2)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "pinned system shared memory" in said[0], said


def test_device_requests_refuse_what_cuda_slots_cannot_do(url, fake_cuda_server):
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.DTypeMismatch):
            c.request("mixed_bytes", 2, shapes={"INPUT1": (2, 3)}, device="cuda:0")  # BYTES input
    with tritonshm.Client(fake_cuda_server.grpc_url, transport="cuda") as c:
        with pytest.raises(tritonshm.InvalidOption, match="transport='cuda'"):
            c.request("batched_fp32", 2, device="cpu")
        req = c.request("batched_fp32", 2)  # transport='cuda': device slots by default
        assert isinstance(req.inputs["INPUT0"], cuda.CudaArray)
        req.close()


def test_chunks_with_rows_of_different_shapes_are_not_joined(fake_cuda):
    from tritonshm.client import _devices

    parts = [device_array(np.zeros((2, 3), np.float32)), device_array(np.zeros((2, 4), np.float32))]
    with pytest.raises(tritonshm.ShapeMismatch, match="different shapes"):
        _devices.concatenate(parts, _devices.Placement(0))
    joined = _devices.concatenate([device_array(np.ones((2, 3), np.float32)),
                                   device_array(np.zeros((1, 3), np.float32))], _devices.Placement(0))
    np.testing.assert_array_equal(joined.get(), np.vstack([np.ones((2, 3)), np.zeros((1, 3))]))


@pytest.mark.parametrize("by_reference", [False, True])
def test_aio_cancelled_during_registration_leaves_nothing_registered_behind(url, fake_cuda_server, by_reference):
    """The registration completes after the caller gave up: its memory must join the pool -- or,
    sent by reference, the table of lent allocations (its tensor held) -- and be unregistered
    with it at close, not be freed while the server holds it open."""
    from tritonshm.client._steps import Register

    data = sample(np.float32, 32)

    def registered(c):
        return [e.name for e in c.lent()] if by_reference else (c.pools()[0].regions if c.pools() else [])

    async def scenario():
        async with tritonshm.aio.Client(url, by_reference=by_reference) as c:
            started, go = asyncio.Event(), asyncio.Event()

            def slowly(register):
                async def slow_register(step):
                    started.set()
                    await go.wait()
                    return await register(step)

                return slow_register

            wrap_step(c, Register, slowly)
            task = asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": device_array(data)}))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            go.set()
            for _ in range(200):  # the shielded registration finishes in the background
                if registered(c) and all(registered(c)):
                    break
                await asyncio.sleep(0.01)
            (name,) = registered(c)
            return name

    name = asyncio.run(scenario())
    with tritonshm.Client(fake_cuda_server.grpc_url) as probe:
        assert name not in tritonshm.status(probe.tritonclient, kind="cuda")


# -- BF16: torch's bfloat16 through DLPack (kDLBfloat, 16) -----------------------------------------

@pytest.mark.parametrize("by_reference", [True, False])
def test_a_torch_2_11_bfloat16_tensor_is_sent_to_a_bf16_model(url, torch_like, by_reference):
    """torch 2.11 exports bfloat16 through its CUDA Array Interface as a void type ('<V2'; the
    torch-like double's too): on an H200 the client took that for the tensor's dtype and refused
    it for a BF16 model ("got |V2").  DLPack names it: the request goes, and the output is right."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    data = sample(bf16, 300)
    tensor = torch_like.from_numpy(data, device=0)
    with tritonshm.Client(url, by_reference=by_reference) as c:
        out = c.infer("identity_bf16", {"INPUT0": tensor})["OUTPUT0"]
        assert out.dtype == bf16
        np.testing.assert_array_equal(out.get(), data)
        assert c.stats().inputs_lent == (1 if by_reference else 0)
        del out
    del tensor


def test_a_torch_bfloat16_tensor_goes_through_cuda_slots_and_comes_back_bfloat16(url, torch_like):
    """torch names bfloat16 by DLPack only (its CUDA Array Interface refused it before 2.11 and
    gives a void type, '<V2', since): the client takes it as ml_dtypes' bfloat16, Triton's BF16,
    and gives back a tensor of the same dtype."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    data = sample(bf16, 777)
    with tritonshm.Client(url) as c:
        tensor = torch_like.from_numpy(data, device=0)
        assert cuda.describe(tensor) == (bf16, (777,), 0)
        out = c.infer("identity_bf16", {"INPUT0": tensor})["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray) and out.dtype == bf16  # torch's own: test_client_cuda_gpu
        np.testing.assert_array_equal(out.get(), data)
        del out
        assert [p.memory for p in c.pools()] == ["cuda:0"]
        with c.request("identity_bf16", shapes={"INPUT0": (777,)}, device="cuda:0") as req:
            torch_like.from_dlpack(req.inputs["INPUT0"]).copy_(data)
            view = req.run()["OUTPUT0"]
            assert isinstance(view, cuda.CudaArray) and view.dtype == bf16
            np.testing.assert_array_equal(view.get(), data)
            del view
