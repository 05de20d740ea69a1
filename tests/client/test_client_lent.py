"""GPU tensors sent by reference: the caller's own allocations lent to a real server (FAKE runtime).

The server is a real Triton with the fake CUDA runtime LD_PRELOADed: it opens
the fake IPC handles of the caller's allocations, as a real one opens
torch's.  Tensors come from a torch-like double with a caching allocator
(blocks carved from segments, ``empty_cache()`` freeing idle segments), so
the fake sees every free: ``freed_while_open`` counts memory freed while the
server still had it open -- what the lending must never allow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading

import numpy as np
import pytest

import tritonshm
import tritonshm.aio

from support.insides import lent_allocations
from triton_fixtures import client_url, sample


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    return client_url(fake_cuda_server, protocol)


def ours(client, kind="cuda"):
    """The server's CUDA regions registered by *client*'s lending."""
    return {name for name in tritonshm.status(client.tritonclient, kind=kind) if name.startswith("tritonshm-lent-")}


def test_an_input_is_sent_by_reference(url, fake_cuda, torch_caching):
    data = sample(np.float32, 1000)
    x = torch_caching.from_numpy(data)
    with tritonshm.Client(url) as c:
        c.model_info("identity_fp32")
        before = fake_cuda.stats()
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        used = fake_cuda.stats() - before
        np.testing.assert_array_equal(out.get(), data)
        assert used.async_copies == 1  # the result out of the slot; nothing copied in
        (lent,) = c.lent()
        assert (lent.device, lent.nbytes, lent.in_use, lent.lent) == (0, 2 << 20, 0, 1)
        assert lent.base == torch_caching.allocator.segments()[0][0]
        assert ours(c) == {lent.name}
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.copied) == (1, 1, {})
        del out
    del x


def test_a_registration_is_reused_and_a_freed_block_handed_out_again_is_read_right(url, fake_cuda, torch_caching):
    with tritonshm.Client(url) as c:
        for value in range(5):
            # each tensor freed after its request: the allocator hands its block (or a neighbour
            # in the same segment) out again for the next, with other bytes in it
            x = torch_caching.from_numpy(np.full(256, value, np.float32))
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_array_equal(out.get(), np.full(256, value, np.float32))
            del x, out
            gc.collect()
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.allocations) == (5, 1, 1)


def test_a_registered_allocation_is_known_by_its_buffer_id(url, fake_cuda, torch_caching, monkeypatch):
    """Issue 40: a tensor in an allocation registered already costs one attribute query, asked when
    the tensor is taken (the driver's buffer id, never reused): no cuMemGetAddressRange, no IPC
    export.  Where the driver gives no ids, the allocation is borrowed again to check it, as before."""
    data = sample(np.float32, 1000)
    x = torch_caching.from_numpy(data)
    with tritonshm.Client(url) as c:
        c.infer("identity_fp32", {"INPUT0": x})  # (its result dropped at once)
        before = fake_cuda.calls()
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        used = fake_cuda.calls() - before
        np.testing.assert_array_equal(out.get(), data)
        assert used["cuPointerGetAttribute"] == 1
        assert used["cuMemGetAddressRange"] == used["cudaIpcGetMemHandle"] == 0
        del out  # (its block holds the next result: no new one, whose region would take a handle)
        monkeypatch.setenv("TSHM_FAKE_CUDA_NO_BUFFER_ID", "1")
        before = fake_cuda.calls()
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        used = fake_cuda.calls() - before
        np.testing.assert_array_equal(out.get(), data)
        assert used["cuMemGetAddressRange"] == used["cudaIpcGetMemHandle"] == 1
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.copied) == (3, 1, {})
        del out
    del x


def test_a_lent_allocation_is_never_freed_under_the_server(url, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.ones(64, np.float32))
    with tritonshm.Client(url) as c:
        c.infer("identity_fp32", {"INPUT0": x})
        del x
        gc.collect()
        # the caller let go of every tensor and empties the cache: the client still holds one
        # tensor of the registered segment, so the segment stays (the server has it open)
        assert torch_caching.empty_cache() == 0
        c.forget()  # unregistered first, then let go
        assert not c.lent() and not ours(c)
        gc.collect()
        assert torch_caching.empty_cache() == 1


def test_a_new_allocation_at_an_old_base_is_registered_anew(url, fake_cuda, torch_caching):
    with tritonshm.Client(url) as c:
        x = torch_caching.empty(4 << 20, np.uint8)  # a segment of its own
        x.copy_(np.full(4 << 20, 1, np.uint8))
        c.infer("identity_uint8", {"INPUT0": x})
        ((old_name, _, base, *_),) = c.lent()
        c.forget()
        del x
        gc.collect()
        assert torch_caching.empty_cache() == 1
        y = torch_caching.empty(4 << 20, np.uint8)
        y.copy_(np.full(4 << 20, 7, np.uint8))
        assert y.ptr == base  # the same address again, a new allocation with a new handle
        out = c.infer("identity_uint8", {"INPUT0": y})["OUTPUT0"]
        assert (out.get() == 7).all()
        ((name, _, again, *_),) = c.lent()
        assert again == base and name != old_name and ours(c) == {name}
        del y, out


class RawCai:
    """Device memory at a raw pointer, seen through the CUDA Array Interface only: holding this
    object does not keep the memory (as with a numba array whose owner frees it)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


@pytest.mark.freed_on_purpose
def test_a_stale_registration_at_an_old_base_is_dropped_first(url, fake_cuda):
    """A producer frees memory the client lent (undefined behaviour under a server that has it
    open: the fake counts it) and allocates again at the same address: the handle there changed,
    so the stale registration is unregistered before the new allocation is registered."""
    nbytes = 4 << 20
    with tritonshm.Client(url) as c:
        first = fake_cuda.malloc(nbytes)
        c.infer("identity_uint8", {"INPUT0": RawCai(first, nbytes)})
        ((old_name, *_),) = c.lent()
        fake_cuda.free(first)
        second = fake_cuda.malloc(nbytes)
        assert second == first  # the same address, a new allocation with a new handle
        nines = np.full(nbytes, 9, np.uint8)  # (held: a temporary's .ctypes.data dangles once it is freed)
        fake_cuda.lib.cudaMemcpy(second, nines.ctypes.data, nbytes, 1)
        out = c.infer("identity_uint8", {"INPUT0": RawCai(second, nbytes)})["OUTPUT0"]
        assert (out.get() == 9).all()
        ((name, _, base, *_),) = c.lent()
        assert base == second and name != old_name and ours(c) == {name}
        c.forget()
        fake_cuda.free(second)
        del out


@pytest.mark.parametrize("kind", ["expandable", "cudaMallocAsync", "cudaMallocManaged"])
def test_memory_cuda_ipc_cannot_share_is_copied_and_counted(url, fake_cuda, torch_like, torch_expandable, kind):
    """Copied, and counted.  On an H200 the refused export of such memory also left the CUDA
    runtime's last error set on the caller's thread, and its next torch op raised "CUDA error:
    invalid argument" (torch checks cudaGetLastError() after every kernel; the torch-like double
    does too): nothing is left for torch to find, and the second request of the same allocation
    asks CUDA nothing (its refusal is remembered)."""
    data = sample(np.float32, 512)
    ptr = None
    if kind == "expandable":
        x = torch_expandable.from_numpy(data)
    else:
        ptr = fake_cuda.malloc_unshareable(data.nbytes, kind)
        fake_cuda.lib.cudaMemcpy(ptr, data.ctypes.data, data.nbytes, 1)

        class Cai:
            __cuda_array_interface__ = {"shape": data.shape, "typestr": "<f4", "data": (ptr, False),
                                        "version": 3, "strides": None, "stream": None}
        x = Cai()
    try:
        with tritonshm.Client(url) as c:
            before = fake_cuda.stats()
            for _ in range(2):
                out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
                np.testing.assert_array_equal(out.get(), data)
                y = torch_like.zeros((8, 4), np.float32)  # raised FakeAcceleratorError before
                np.testing.assert_array_equal(y.numpy(), np.zeros((8, 4), np.float32))
                del out, y
            assert (fake_cuda.stats() - before).ipc_get_refusals == 1
            stats = c.stats()
            assert stats.inputs_lent == 0 and stats.copied == {"not shareable": 2}
            assert not c.lent()
    finally:
        del x
        if ptr is not None:
            fake_cuda.free(ptr)


def test_by_reference_false_copies(url, torch_caching):
    x = torch_caching.from_numpy(np.ones(32, np.float32))
    with tritonshm.Client(url, by_reference=False) as c:
        c.infer("identity_fp32", {"INPUT0": x})
        assert not c.lent() and c.stats().inputs_lent == 0 and c.by_reference is False
    del x


def test_the_bounds_hold_and_only_cold_allocations_make_room(url, fake_cuda, torch_caching):
    with tritonshm.Client(url, max_lent_bytes=5 << 20) as c:
        table = lent_allocations(c)
        # each a segment of its own; a is given twice (an idle allocation lent once when a new one
        # appears is taken for the fresh allocation per request that "used once" copies)
        a = torch_caching.empty(4 << 20, np.uint8)
        b = torch_caching.empty(2 << 20, np.uint8)
        c.infer("identity_uint8", {"INPUT0": a})
        c.infer("identity_uint8", {"INPUT0": a})
        assert len(c.lent()) == 1
        # b does not fit beside a, and a was used just now: b is copied, a stays
        c.infer("identity_uint8", {"INPUT0": b})
        assert [e.base for e in c.lent()] == [a.ptr]
        assert c.stats().copied == {"bounds": 1}
        table.cold_seconds = 0.0  # a is cold now: it makes room
        c.infer("identity_uint8", {"INPUT0": b})
        assert [e.base for e in c.lent()] == [b.ptr] and len(ours(c)) == 1
        assert c.stats().evictions == 1
        # a tensor larger than the bound is never lent
        big = torch_caching.empty(6 << 20, np.uint8)
        c.infer("identity_uint8", {"INPUT0": big})
        assert sum(e.nbytes for e in c.lent()) <= 5 << 20
        del a, b, big


def test_close_unregisters_then_lets_go(url, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.ones(64, np.float32))
    c = tritonshm.Client(url)
    c.infer("identity_fp32", {"INPUT0": x})
    probe = tritonshm.Client(url)
    (name,) = ours(c)
    del x
    c.close()
    assert name not in tritonshm.status(probe.tritonclient, kind="cuda")
    probe.close()
    gc.collect()
    assert torch_caching.empty_cache() == 1  # the client let go of its tensor


def test_many_threads_lend_one_allocation_once(url, fake_cuda, torch_caching):
    tensors = [torch_caching.from_numpy(np.full(128, i, np.float32)) for i in range(16)]
    assert len(torch_caching.allocator.segments()) == 1
    with tritonshm.Client(url, slots=4) as c:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda t: c.infer("identity_fp32", {"INPUT0": t})["OUTPUT0"].get(),
                                 tensors * 3))
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.full(128, i % 16, np.float32))
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.allocations) == (48, 1, 1)
        assert [e.in_use for e in c.lent()] == [0]
    del tensors


def test_results_written_in_place_with_out(url, fake_cuda, torch_caching):
    data = sample(np.float32, 300)
    x = torch_caching.from_numpy(data)
    y = torch_caching.empty(300, np.float32)
    with tritonshm.Client(url) as c:
        c.model_info("identity_fp32")
        before = fake_cuda.stats()
        got = c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        used = fake_cuda.stats() - before
        assert got["OUTPUT0"] is y and used.async_copies == 0  # no copy either way
        np.testing.assert_array_equal(y.numpy(), data)
        stats = c.stats()
        assert (stats.inputs_lent, stats.outputs_lent, stats.registrations) == (1, 1, 1)  # one segment
    del x, y


def test_out_that_cannot_be_lent_is_copied_into(url, torch_caching, torch_expandable):
    data = sample(np.float32, 100)
    x = torch_caching.from_numpy(data)
    y = torch_expandable.empty(100, np.float32)
    with tritonshm.Client(url) as c:
        assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"] is y
        np.testing.assert_array_equal(y.numpy(), data)
        assert c.stats().outputs_lent == 0
    del x, y


def test_out_is_checked_before_anything_is_sent(url, torch_caching):
    x = torch_caching.from_numpy(np.ones(8, np.float32))
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.DTypeMismatch, match="out"):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": torch_caching.empty(8, np.int32)})
        with pytest.raises(tritonshm.InvalidOption, match="GPU tensor"):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": np.empty(8, np.float32)})
        with pytest.raises(tritonshm.InvalidOption, match="returns"):
            c.infer("identity_fp32", {"INPUT0": x}, out={"NOPE": torch_caching.empty(8, np.float32)})
        with pytest.raises(tritonshm.InvalidOption, match="copy=False"):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": torch_caching.empty(8, np.float32)},
                    copy=False)
        with pytest.raises(tritonshm.ShapeMismatch, match="out"):  # the server's shape is checked too
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": torch_caching.empty(16, np.float32)})
        assert c.stats().inputs_lent <= 1
        # one tensor for two outputs: both would be written there, one result silently lost
        ones = torch_caching.from_numpy(np.ones(16, np.float32))
        y, z = torch_caching.empty(16, np.float32), torch_caching.empty(16, np.float32)
        with pytest.raises(tritonshm.InvalidOption, match="overlap"):
            c.infer("add_sub", {"INPUT0": ones, "INPUT1": ones}, out={"OUTPUT0": y, "OUTPUT1": y})
        got = c.infer("add_sub", {"INPUT0": ones, "INPUT1": ones}, out={"OUTPUT0": y, "OUTPUT1": z})
        np.testing.assert_array_equal(got["OUTPUT0"].numpy(), np.full(16, 2, np.float32))
        np.testing.assert_array_equal(got["OUTPUT1"].numpy(), np.zeros(16, np.float32))
        del got, ones, y, z
    del x


def test_infer_async_and_aio_lend_too(url, fake_cuda, torch_caching):
    data = sample(np.float32, 64)
    x = torch_caching.from_numpy(data)
    with tritonshm.Client(url) as c:
        out = c.infer_async("identity_fp32", {"INPUT0": x}).result()["OUTPUT0"]
        np.testing.assert_array_equal(out.get(), data)
        assert c.stats().inputs_lent == 1
        del out

    async def main(x):
        async with tritonshm.aio.Client(url) as ac:
            y = torch_caching.empty(64, np.float32)
            got = await ac.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            assert got["OUTPUT0"] is y
            np.testing.assert_array_equal(y.numpy(), data)
            assert (ac.stats().inputs_lent, ac.stats().outputs_lent) == (1, 1)
            await ac.forget()
            assert not ac.lent()

    asyncio.run(main(x))
    del x


def test_a_lent_allocation_the_server_forgot_is_registered_again(url, torch_caching):
    data = sample(np.float32, 128)
    x = torch_caching.from_numpy(data)
    with tritonshm.Client(url) as c:
        c.infer("identity_fp32", {"INPUT0": x})
        (lent,) = c.lent()
        c.tritonclient.unregister_cuda_shared_memory(lent.name)  # as a restarted server would have
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"].get(), data)
        assert [e.name for e in c.lent()] == [lent.name] and lent.name in ours(c)  # the same name again
        assert c.stats().registrations == 1  # registered again, not anew
    del x


def test_a_streamed_request_lends_its_input(fake_cuda_server, fake_cuda, torch_caching):
    data = sample(np.float32, 64)
    x = torch_caching.from_numpy(data)
    count = torch_caching.from_numpy(np.array([3], np.int32))
    with tritonshm.Client(fake_cuda_server.grpc_url) as c:
        responses = list(c.stream("stream_fp32", {"INPUT0": x, "COUNT": count}))
        assert len(responses) == 3
        for i, response in enumerate(responses):
            np.testing.assert_array_equal(response["OUTPUT0"].get(), data + i)
        assert c.stats().inputs_lent == 2 and [e.in_use for e in c.lent()] == [0]
    del x, count


def test_a_server_that_cannot_open_cuda_memory_gets_copies_and_says_so(server, fake_cuda, torch_caching):
    """The session's plain server (no fake inside it) cannot open CUDA handles: the lent
    registration is refused once, every GPU tensor is copied from then on (through pinned
    host slots, with the usual one warning), and stats() says why."""
    data = sample(np.float32, 64)
    x = torch_caching.from_numpy(data)
    with tritonshm.Client(server.grpc_url) as c:
        with pytest.warns(RuntimeWarning, match="fall back to pinned"):
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        np.testing.assert_array_equal(out.get(), data)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"].get(), data)
        stats = c.stats()
        assert stats.inputs_lent == 0 and stats.registrations == 0 and not c.lent()
        assert stats.copied == {"server cannot open CUDA memory": 2}
        del out
    del x


def test_a_lent_input_is_read_after_the_work_queued_on_it(url, fake_cuda, torch_caching):
    """The caller's kernel that fills the tensor is still queued on its stream when it calls: the
    server reads the tensor in place, so the request waits for that work (the fake lands nothing
    until something synchronizes it: a request sent too early would read the old bytes)."""
    x = torch_caching.zeros(256, np.float32)
    torch_caching.synchronize()
    with tritonshm.Client(url) as c:
        with torch_caching.stream():
            x.fill_(7.0)  # queued, not landed
            assert fake_cuda.pending() > 0
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert (out.get() == 7.0).all()
        assert c.stats().inputs_lent == 1
        del out
    del x


def test_a_view_of_our_own_slot_is_named_in_place_and_never_held(url, fake_cuda):
    """A result kept with copy=False is a view of one of the client's CUDA slots: sent again, it is
    named in the slot's own registration (nothing registered, nothing held by the lent table; its
    own result written in place: nothing copied), and the slot comes back once the view is gone."""
    data = sample(np.float32, 128)
    with tritonshm.Client(url) as c, tritonshm.CudaRegion.create(data.nbytes) as region:
        region.write(data)
        view = c.infer("identity_fp32", {"INPUT0": region.view(np.float32, 128)}, copy=False)["OUTPUT0"]
        c.forget()  # the first input's allocation: out of the way
        before = fake_cuda.stats()
        out = c.infer("identity_fp32", {"INPUT0": view})["OUTPUT0"]
        assert (fake_cuda.stats() - before).async_copies == 0  # the input named in place, the result in place
        np.testing.assert_array_equal(out.get(), data)
        stats = c.stats()
        assert stats.inputs_lent == 2 and stats.registrations == 1 and not c.lent()
        del view, out
        gc.collect()
        assert all(pool.held == 0 for pool in c.pools())


def test_max_lent_bytes_holds_at_every_instant_under_a_burst(url, fake_cuda, torch_caching):
    """Eight threads send tensors of six 4 MiB allocations, over and over, to a client allowed two
    of them at once (and every idle one cold at once, so they churn): the bytes the table holds --
    registered, being registered, let go of but not yet unregistered -- never pass the bound,
    every output is right, and what does not fit is copied."""
    limit = 9 << 20
    tensors = []
    for i in range(6):
        t = torch_caching.empty(4 << 20, np.uint8)  # a segment of its own each
        t.copy_(np.full(4 << 20, i, np.uint8))
        tensors.append(t)
    torch_caching.synchronize()
    with tritonshm.Client(url, max_lent_bytes=limit, slots=2) as c:
        table = lent_allocations(c)
        table.cold_seconds = 0.0
        peak, stop = [0], threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], table.budget.used)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                firsts = list(pool.map(lambda i: int(c.infer("identity_uint8", {"INPUT0": tensors[i % 6]})
                                                     ["OUTPUT0"].get()[0]), range(48)))
        finally:
            stop.set()
            watcher.join()
        assert firsts == [i % 6 for i in range(48)]
        assert 0 < peak[0] <= limit
        stats = c.stats()
        assert stats.inputs_lent + sum(stats.copied.values()) == 48 and stats.inputs_lent > 0
    del tensors


@pytest.mark.server
def test_gpu_tensors_of_a_request_on_the_wire_are_counted_as_copied(fake_cuda, torch_caching):
    """A server with a /dev/shm of its own opens none of our memory: requests travel in the
    message, their GPU inputs and out= tensors copied -- and stats() says so (it said nothing)."""
    from tritonshm.server import LocalServer
    from triton_fixtures import start_or_skip

    data = sample(np.float32, 64)
    x = torch_caching.from_numpy(data)
    y = torch_caching.empty(64, np.float32)
    with start_or_skip(LocalServer(private_shm=True)) as isolated:
        with tritonshm.Client(isolated.grpc_url) as c:
            with pytest.warns(RuntimeWarning):
                out = c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            assert out["OUTPUT0"] is y
            np.testing.assert_array_equal(y.numpy(), data)
            stats = c.stats()
            assert stats.inputs_lent == stats.outputs_lent == 0
            # (the first request's lending was refused: each tensor counted once, for that)
            assert stats.copied == {"server cannot open CUDA memory": 2}
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            assert c.stats().copied == {"server cannot open CUDA memory": 2, "on the wire": 2}
    del x, y


@pytest.mark.server
def test_a_server_restarted_unable_to_open_lent_tensors_gets_copies(fake_cudart_path, fake_cuda, torch_caching):
    """The server that had our lent tensors restarts as one that cannot open our memory (a
    container restarted without --ipc=host): the request that finds it may fail (its lent tensors,
    registered again, are refused), and from the next on the tensors are copied -- here onto the
    wire, the slots refused too -- where every request was refused, for ever."""
    import warnings

    from tritonshm.server import LocalServer
    from fake_cuda import server_env
    from triton_fixtures import restarted_unable_to_open_our_memory, start_or_skip

    data = sample(np.float32, 64)
    x, y = torch_caching.from_numpy(data), torch_caching.empty(64, np.float32)
    with start_or_skip(LocalServer(env=server_env(fake_cudart_path))) as srv:
        with tritonshm.Client(srv.grpc_url) as c:
            for _ in range(2):
                c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            assert c.stats().inputs_lent == c.stats().outputs_lent == 2
            with restarted_unable_to_open_our_memory(srv, env=server_env(fake_cudart_path)):
                outcomes = []
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # (falling back to the wire)
                    for i in range(3):
                        try:
                            y.fill_(-1.0)
                            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
                            outcomes.append(bool(np.array_equal(y.numpy(), data)))
                        except tritonshm.SharedMemoryRefused:
                            outcomes.append("refused")
                assert outcomes[0] in ("refused", True) and outcomes[1:] == [True, True], outcomes
    del x, y


def test_tensors_lent_from_one_allocation_are_each_named_where_they_are(url, fake_cuda, torch_caching):
    """Two tensors in one segment of the caching allocator (one registration, two offsets), sent
    in turn with the same shape: each request names its own tensor -- the request objects and
    messages kept per place a tensor is lent from, never per shape alone."""
    first, second = np.full(1024, 1.0, np.float32), np.full(1024, 2.0, np.float32)
    x, y = torch_caching.from_numpy(first), torch_caching.from_numpy(second)
    out = torch_caching.empty(1024, np.float32)
    with tritonshm.Client(url) as c:
        for _ in range(3):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"].get(), first)
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": y})["OUTPUT0"].get(), second)
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": out})
            np.testing.assert_array_equal(out.numpy(), first)
            c.infer("identity_fp32", {"INPUT0": y}, out={"OUTPUT0": out})
            np.testing.assert_array_equal(out.numpy(), second)
        assert len(c.lent()) == 1 and c.stats().inputs_lent == 12  # (one segment, one registration)
    del x, y, out
