"""Lending without hazards: memory the server may still touch is held until it is done (FAKE runtime).

Each test here is one of the paths a review of the lending path found where
the caller's GPU memory went back to it (to torch's caching allocator, which
hands a freed block to the next tensor at once) while the server could still
read or write it: a request the client gave up on (``client_timeout``, a
cancelled aio call, a stream closed early, ``close()`` that stopped waiting),
and the smaller ones beside them (slot room for lent tensors, read-only and
undersized ``out=``, ``out=`` on host routes, allocations used once).

The server is a real Triton with the fake CUDA runtime LD_PRELOADed (see
test_client_lent.py); ``slow_fp32`` answers 500 ms after it is asked, so a
request given up on at 0.1 s is still running on the server when the call
returns -- and writes its output 0.4 s later, into whatever the caller's
``out=`` block is by then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time

import numpy as np
import pytest

import tritonshm
import tritonshm.aio

from support.insides import release_held_for_the_server
from fake_cuda import server_env
from triton_fixtures import client_url, start_or_skip, wait_until

N = 16384  # floats: 64 KiB, a block of a 2 MiB segment of the caching double
SLOW = 0.5  # slow_fp32's delay


def grpc_url(server):
    return client_url(server, "grpc")


# -- 1. a request the client gave up on -------------------------------------------------------------

@pytest.mark.parametrize("warm", [False, True])
def test_a_timed_out_request_keeps_its_out_block_until_the_server_is_done(fake_cuda_server, fake_cuda,
                                                                          torch_caching, warm):
    """The caller drops its out= tensor right after the timeout: its block must not go to the next
    tensor while the server may still write OUTPUT0 there.  *warm*: the call was made once before,
    so it takes the warm all-lent path (Runner.lent_quick_steps)."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        c.model_info("slow_fp32")
        if warm:
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=5)
            y.fill_(0)
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.1)
        y_ptr, x_ptr = y.ptr, x.ptr
        del y, x
        gc.collect()
        # the next tensors of that size: never the blocks the server may still write or read
        z = torch_caching.zeros(N)
        w = torch_caching.zeros(N)
        # the zeros land now (the fake lands queued work only when synchronized): a late write
        # into z or w below is seen, not wiped by a fill still queued when they are read
        torch_caching.synchronize()
        assert {z.ptr, w.ptr}.isdisjoint({y_ptr, x_ptr})
        assert c.stats().abandoned == 1 and c.stats().awaiting_server >= 1
        time.sleep(SLOW + 0.5)  # the abandoned request has written its output by now
        assert not z.numpy().any() and not w.numpy().any()
        # ... where it was meant to: into y's block, still held for the server (the request really
        # was running, and wrote, after the call gave up on it)
        assert (np.frombuffer(fake_cuda.read(y_ptr, 4 * N), np.float32) == 7).all()
        # the client found out that the server let go (an unregistration it no longer refuses)
        # at its next request, and let go of the blocks then
        c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})
        wait_until(lambda: c.stats().awaiting_server == 0)
        del z, w


def test_a_retry_into_the_same_out_waits_for_the_request_it_replaces(fake_cuda_server, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    x2 = torch_caching.from_numpy(np.full(N, 9, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        c.model_info("slow_fp32")
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.1)
        # the same out= tensor again, for another input, on a model that answers at once: the call
        # waits until the old request is over, so the old request's late write cannot land on it
        assert c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y})["OUTPUT0"] is y
        assert (y.numpy() == 9).all()
        time.sleep(SLOW + 0.3)
        assert (y.numpy() == 9).all()
        # and it says so within slot_timeout, naming the output
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.1)
        with pytest.raises(tritonshm.TensorInUse, match="OUTPUT0"):
            c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y}, slot_timeout=0.05)
        time.sleep(SLOW)
    del x, x2, y


@pytest.mark.parametrize("warm", [False, True])
def test_a_call_into_an_out_another_call_is_writing_waits_for_it(fake_cuda_server, fake_cuda, torch_caching, warm):
    """Two calls into one out= tensor at once, neither given up on: the second waits until the
    first is answered (the server's two writes never interleave, the later call's values are the
    ones left), and says so (TensorInUse) within its slot_timeout.  *warm*: the second call was
    made once before, so it takes the warm all-lent path (Runner.lent_quick_steps)."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    x2 = torch_caching.from_numpy(np.full(N, 9, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        c.model_info("slow_fp32")
        c.model_info("identity_fp32")
        if warm:
            for slot_timeout in (0.05, 5):  # each identity call below, seen once before
                c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y}, slot_timeout=slot_timeout)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.infer, "slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            time.sleep(0.15)  # the first call is on the server now
            with pytest.raises(tritonshm.TensorInUse, match="OUTPUT0"):
                c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y}, slot_timeout=0.05)
            assert c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y}, slot_timeout=5)["OUTPUT0"] is y
            assert first.result(timeout=5)["OUTPUT0"] is y
        time.sleep(0.1)
        assert (y.numpy() == 9).all()  # the second call's values: it wrote after the first was over
        assert c.stats().abandoned == 0
    del x, x2, y


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cancelled_aio_call_keeps_its_tensors_until_the_server_is_done(fake_cuda_server, fake_cuda,
                                                                         torch_caching, protocol):
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    url = client_url(fake_cuda_server, protocol)

    async def main(x, y):
        async with tritonshm.aio.Client(url) as ac:
            await ac.model_info("slow_fp32")
            task = asyncio.ensure_future(ac.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}))
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            y_ptr = y.ptr
            del y, task
            gc.collect()
            z = torch_caching.zeros(N)
            torch_caching.synchronize()  # z's zeros land now: a late write into z below is seen
            assert z.ptr != y_ptr
            await asyncio.sleep(SLOW + 0.3)
            assert not z.numpy().any()
            # the request wrote its output after the call was cancelled, into y's block
            assert (np.frombuffer(fake_cuda.read(y_ptr, 4 * N), np.float32) == 7).all()
            # the cancelled call's steps waited for the server's answer (its I/O is shielded):
            # the claim ended with it, answered -- nothing is held for the server now
            stats = ac.stats()
            assert (stats.abandoned, stats.awaiting_server, stats.outputs_lent) == (0, 0, 1)
            del z

    asyncio.run(main(x, y))
    del x, y


def test_a_streamed_request_whose_answer_is_not_waited_for_keeps_its_input(fake_cuda_server, fake_cuda,
                                                                          torch_caching):
    """A streamed request's wait for its response times out (client_timeout): the request stays
    on the stream, and its lent input -- which the caller drops -- is held until its final
    response, not handed to the next tensor while the server may still read it."""
    keeper = torch_caching.from_numpy(np.ones(N, np.float32))
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    assert len(torch_caching.allocator.segments()) == 1  # both blocks of one segment
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        c.model_info("slow_fp32")
        # the segment is registered for another tensor first: the registration holds that one
        # (a registration holds the first tensor lent from its allocation), so x's block is held
        # only by what holds the streamed request's claim
        c.infer("identity_fp32", {"INPUT0": keeper})
        assert len(c.lent()) == 1
        responses = c.stream("slow_fp32", {"INPUT0": x}, client_timeout=0.1)
        with pytest.raises(tritonshm.ServerTimeout):
            next(responses)
        responses.close()
        x_ptr = x.ptr
        del x
        gc.collect()
        z = torch_caching.zeros(N)
        assert z.ptr != x_ptr
        time.sleep(SLOW + 0.2)  # the final response came meanwhile: the server is done with it
        assert c.stats().awaiting_server == 0 and c.stats().abandoned == 0
        assert c.stats().inputs_lent == 2  # (x was lent, not copied: its block was the server's)
        del z
    del keeper


@pytest.mark.server  # (a server of its own: not from the fixtures that mark their users)
def test_a_stream_ended_early_keeps_its_lent_input_until_the_server_is_done(fake_cudart_path, fake_cuda,
                                                                           torch_caching):
    """close() ends a stream whose request still runs (after a grace period the stream is cancelled:
    a server of this test's own): the stream's end is not the server's answer, so the request's
    lent input -- which the caller drops -- stays held for the server, never handed to the next
    tensor.  (The asyncio client; for the blocking one's stream reader after that cancel, see
    test_closing_a_client_mid_stream_ends_its_stream_reader.)"""
    from tritonshm.server import LocalServer

    with start_or_skip(LocalServer(env=server_env(fake_cudart_path))) as srv:
        keeper = torch_caching.from_numpy(np.ones(N, np.float32))  # the registration's own hold
        x = torch_caching.from_numpy(np.full(N, 7, np.float32))
        count = torch_caching.from_numpy(np.array([3], np.int32))
        assert len(torch_caching.allocator.segments()) == 1

        async def main(x, count):
            ac = tritonshm.aio.Client(srv.grpc_url, slot_timeout=0.05)
            await ac.infer("identity_fp32", {"INPUT0": keeper})
            # 3 responses 1.5 s apart: the request runs for 3 s, past close()'s grace period (2 s)
            responses = ac.stream("stream_fp32", {"INPUT0": x, "COUNT": count}, parameters={"delay_ms": 1500})
            first = await responses.__anext__()
            np.testing.assert_array_equal(first["OUTPUT0"].get(), np.full(N, 7, np.float32))
            await ac.close()
            with pytest.raises(tritonshm.ClientClosed):  # (after the responses that came meanwhile)
                async for _ in responses:
                    pass
            assert ac.stats().abandoned == 1
            return x.ptr

        x_ptr = asyncio.run(main(x, count))
        del x, count
        gc.collect()
        z = torch_caching.zeros(N)
        torch_caching.synchronize()
        assert z.ptr != x_ptr  # x's block: still held for the server
        assert torch_caching.empty_cache() == 0
        time.sleep(1.5)  # (this test's own clean-up, once the server let go)
        with tritonshm.Client(srv.grpc_url) as probe:
            release_held_for_the_server(probe.tritonclient)
        del z, keeper


@pytest.mark.server
def test_closing_a_client_mid_stream_ends_its_stream_reader(fresh_server):
    """close() with a streamed request still running past the grace period cancels the stream: its
    reader thread ends too (it holds the stream's table, and through the error raised to the
    caller the request's plan -- the caller's tensors).  It waited for good in grpc's
    debug_error_string(), which tritonclient's error asks for, on the cancelled call."""
    c = tritonshm.Client(fresh_server.grpc_url)
    responses = c.stream("stream_fp32", {"INPUT0": np.ones(4, np.float32), "COUNT": np.array([3], np.int32)},
                         parameters={"delay_ms": 1500})
    next(responses)
    before = {t for t in threading.enumerate() if t.name == "tritonshm-stream"}
    c.close()
    with pytest.raises(tritonshm.ClientClosed):
        list(responses)
    deadline = time.monotonic() + 3
    while any(t.is_alive() for t in before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.is_alive() for t in before)


@pytest.mark.parametrize("slot_timeout", [0.3, 0.05])
def test_close_that_stops_waiting_holds_what_the_server_still_uses(fake_cuda_server, fake_cuda, torch_caching,
                                                                  slot_timeout):
    """close() waits slot_timeout for requests in flight, then asks the server to let go of their
    lent allocations for as long again: one that lets go meanwhile (0.3 s: the request ends at
    0.5 s) is unregistered and let go of; one that does not (0.05 s) stays held, registered, for
    the life of the process -- never given back to the caller's allocator under the server."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    c = tritonshm.Client(grpc_url(fake_cuda_server), slot_timeout=slot_timeout)
    probe = tritonshm.Client(grpc_url(fake_cuda_server))
    c.model_info("slow_fp32")

    def call():
        try:
            c.infer("slow_fp32", {"INPUT0": x})
        except tritonshm.Error:  # the closed channel, or the closed slot: its results are lost
            pass

    running = threading.Thread(target=call)  # (infer_async's workers are waited for by close())
    running.start()
    time.sleep(0.1)
    c.close()
    running.join()
    lent = {n for n in tritonshm.status(probe.tritonclient, kind="cuda") if n.startswith("tritonshm-lent-")}
    # the caller lets go of everything, the closed client too: what is held for the server is held
    # by the process, not by a client object the caller dropped
    del x, running, c
    gc.collect()
    if slot_timeout == 0.3:
        assert not lent and torch_caching.empty_cache() == 1  # nothing holds the segment any more
    else:
        assert lent and torch_caching.empty_cache() == 0  # held: the server has it open
        time.sleep(SLOW)  # (this test's own clean-up, once the server let go)
        release_held_for_the_server(probe.tritonclient)
    probe.close()


# -- 3. lent tensors take no slot room ---------------------------------------------------------------

def test_lent_tensors_take_no_room_in_a_slot(fake_cuda_server, fake_cuda, torch_caching):
    count = (160 << 20) // 4
    x = torch_caching.empty(count, np.float32)
    y = torch_caching.empty(count, np.float32)
    x.fill_(3.0)
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:  # the defaults: 4 slots, 1 GiB
        assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"] is y
        assert (y.numpy()[:: 1 << 20] == 3).all()
        assert (c.stats().inputs_lent, c.stats().outputs_lent) == (1, 1)
        assert not c.pools()  # everything lent: no slot leased, none made
    del x, y


# -- 5, 7, 8. out= ------------------------------------------------------------------------------------

def test_a_read_only_out_is_refused_before_anything_is_sent(fake_cuda_server, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.ones(8, np.float32))
    y = torch_caching.zeros(8)
    y.read_only = True  # exported with DLPack's read-only flag
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        with pytest.raises(tritonshm.ReadOnlyRegion, match="OUTPUT0"):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        assert c.stats().outputs_lent == 0 and not c.pools()
    del x, y


def test_out_on_a_host_route_is_lent_too(fake_cuda_server, fake_cuda, torch_caching):
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        y = torch_caching.zeros(8)
        got = c.infer("identity_fp32", {"INPUT0": np.full(8, 5, np.float32)}, output_device="cuda",
                      out={"OUTPUT0": y})
        assert got["OUTPUT0"] is y and (y.numpy() == 5).all()
        stats = c.stats()  # (numpy inputs: host slots; the result written where the caller wants it)
        assert (stats.outputs_lent, stats.copied) == (1, {})
    del y


def _executions(client, model):
    stats = client.tritonclient.get_inference_statistics(model, as_json=True)
    return int(stats["model_stats"][0].get("execution_count", 0))


@pytest.mark.parametrize("lend", [True, False])
def test_an_undersized_out_fails_once_naming_the_bytes(fake_cuda_server, fake_cuda, torch_caching, lend):
    x = torch_caching.from_numpy(np.ones(1000, np.float32))
    y = torch_caching.empty(1000, np.float32)  # tile_fp32 returns 2000 values
    with tritonshm.Client(grpc_url(fake_cuda_server), by_reference=lend) as c:
        c.model_info("tile_fp32")
        before = _executions(c, "tile_fp32")
        with pytest.raises(tritonshm.ShapeMismatch, match=r"OUTPUT0.*8000 bytes"):
            c.infer("tile_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        # (the server counts an execution a moment after it answered: wait for it, then for more)
        wait_until(lambda: _executions(c, "tile_fp32") > before)
        time.sleep(0.3)
        assert _executions(c, "tile_fp32") - before == 1
    del x, y


# -- 4. lend only what pays ------------------------------------------------------------------------------

def test_fresh_large_tensors_per_request_are_copied_not_pinned(fake_cuda_server, fake_cuda, torch_caching):
    """The everyday loop ``x = batch.cuda(); c.infer(m, {"x": x}); del x`` with 64 MiB batches:
    the client must not hold each one (torch would make a new segment per request)."""
    nbytes = 64 << 20
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        for i in range(12):
            x = torch_caching.empty(nbytes, np.uint8)
            x.fill_(i)
            out = c.infer("identity_uint8", {"INPUT0": x})["OUTPUT0"]
            assert int(out.get()[-1]) == i
            del x, out
            gc.collect()
        reserved = sum(size for _, size in torch_caching.allocator.segments())
        assert reserved <= 4 * nbytes
        assert len(c.lent()) <= 2
        assert c.stats().copied.get("used once", 0) >= 10


@pytest.mark.parametrize("fresh_first", [False, True])
def test_reused_buffers_are_lent_every_time_and_registered_once(fake_cuda_server, fake_cuda, torch_caching,
                                                                fresh_first):
    """Buffers the caller reuses are lent on every request and registered once -- also after a
    loop of fresh tensors per request (*fresh_first*) made the client copy new allocations: a
    tensor given again is lent from its second request on."""
    nbytes = 64 << 20
    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        if fresh_first:
            for i in range(3):
                t = torch_caching.empty(nbytes, np.uint8)
                t.fill_(i)
                c.infer("identity_uint8", {"INPUT0": t})
                del t
                gc.collect()
            assert c.stats().copied.get("used once", 0) >= 1  # the client copies new allocations now
        before = c.stats()
        x = torch_caching.empty(nbytes, np.uint8)
        y = torch_caching.empty(nbytes, np.uint8)
        for i in range(30):
            x.fill_(i)
            c.infer("identity_uint8", {"INPUT0": x}, out={"OUTPUT0": y})
            assert int(y.numpy()[-1]) == i
        stats = c.stats()
        if not fresh_first:
            assert stats.registrations <= 2 and (stats.inputs_lent, stats.outputs_lent) == (30, 30)
            assert stats.copied == {}
        else:  # the first request copies both (new allocations), the others lend them
            assert stats.registrations - before.registrations <= 2
            assert (stats.inputs_lent - before.inputs_lent, stats.outputs_lent - before.outputs_lent) == (29, 29)
        del x, y


def test_threads_giving_up_and_retrying_never_see_a_late_write(fake_cuda_server, fake_cuda, torch_caching):
    """Three threads, each with its own out= tensor, alternate a request they give up on (slow_fp32,
    client_timeout) with one that must be answered (identity_fp32 into the same out=), dropping and
    making tensors as they go: every answered call leaves exactly its own values in its out= --
    none overwritten later by a request given up on -- and nothing is freed under the server."""
    import concurrent.futures

    with tritonshm.Client(grpc_url(fake_cuda_server)) as c:
        c.model_info("slow_fp32")
        c.model_info("identity_fp32")

        def worker(k):
            y = torch_caching.zeros(N)
            for i in range(2):
                stale = torch_caching.from_numpy(np.full(N, -1.0 - k, np.float32))
                with pytest.raises(tritonshm.ServerTimeout):
                    c.infer("slow_fp32", {"INPUT0": stale}, out={"OUTPUT0": y}, client_timeout=0.05)
                del stale
                fresh = torch_caching.from_numpy(np.full(N, 100.0 * k + i, np.float32))
                c.infer("identity_fp32", {"INPUT0": fresh}, out={"OUTPUT0": y})
                assert (y.numpy() == 100.0 * k + i).all(), (k, i)
                del fresh
            return y

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            ys = list(pool.map(worker, range(3)))
        time.sleep(SLOW + 0.3)  # every request given up on is over by now
        for k, y in enumerate(ys):
            assert (y.numpy() == 100.0 * k + 1).all(), k
        stats = c.stats()
        assert stats.abandoned == 6
        c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})  # asks the server to let go again
        wait_until(lambda: c.stats().awaiting_server == 0)
        del ys
