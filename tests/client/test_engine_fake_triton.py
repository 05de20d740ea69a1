"""The client engine against a fake Triton (tests/support/fake_triton.py): no server, milliseconds.

Pool creation under bursts of cold requests (threads, and asyncio tasks
cancelled at random), growth for kept results up to ``max_pool_bytes``,
replacement by a larger pool, the fallback to the wire, re-registration
after a restart, and close() against a server that says "in use" or while
requests are still running.  The fake records every registered byte: its
peak, and the clients' own byte budget sampled at every step, must stay
within ``max_pool_bytes``; and it checks that no slot memory is closed while
it is still registered.

Three engine bugs were found here first (a request waiting for byte-budget
room spinning past its deadline, a cancelled request leaking the extent it
was dropping, a request answered after close() gave up on it failing with a
TypeError); their tests stay.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import random
import re
import threading
import time

import numpy as np
import pytest

import tritonshm
from tritonshm._units import in_units, nbytes_text
from tritonshm.errors import ClientClosed, PoolExhausted, ServerError, ServerUnavailable, SharedMemoryRefused

from support.fake_triton import FakeTriton
from support.insides import budget_used, free_slots, live_pool, record_plans

BURST = 300
ELEMENTS = 1024                  # 4 KiB in, 4 KiB out: 8 KiB slots, 32 KiB extents of 4 slots
SLOT = 8192
EXTENT = 4 * SLOT
MAX_POOL_BYTES = 2 * EXTENT      # room for the pool and one extent of growth, not for 300 pools


def data(seed: int, elements: int = ELEMENTS) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(elements, dtype=np.float32)


def assert_nothing_registered(fake: FakeTriton) -> None:
    assert fake.registered == {}
    assert fake.registered_bytes == 0


# -- bursts of cold requests ----------------------------------------------------


def _nbytes(n: int) -> str:  # a size as the messages give it: exact bytes, the unit beside them
    return re.escape(nbytes_text(n))


def _cap(n: int) -> str:
    return re.escape(f"max_pool_bytes={n} ({in_units(n)})")


def test_a_burst_of_cold_threads_with_cancels_makes_one_pool(fake_triton):
    fake = fake_triton
    fake.delay = 0.0005   # requests overlap: 300 of them on 64 threads, 4 slots
    rng = random.Random(18)
    with fake.client(max_pool_bytes=MAX_POOL_BYTES) as c, fake.sampling():
        c.model_info("identity_fp32")  # metadata first: the burst is about pools
        inputs = [data(i) for i in range(BURST)]
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(c.infer, "identity_fp32", {"INPUT0": x}) for x in inputs]
            cancelled = {i for i in rng.sample(range(BURST), BURST // 3) if futures[i].cancel()}
            answered = 0
            for i, (x, future) in enumerate(zip(inputs, futures)):
                if i in cancelled:
                    assert future.cancelled()
                    continue
                np.testing.assert_array_equal(future.result()["OUTPUT0"], x)
                answered += 1
        assert answered >= BURST - BURST // 3
        assert len(c.pools()) == 1
        assert budget_used(c) <= MAX_POOL_BYTES
    print(f"\nthreads: {answered} answered, {len(cancelled)} cancelled, {fake.memory_made} extents made, "
          f"{fake.registrations} registered; peak registered {fake.peak_bytes}, alive {fake.memory_peak}, "
          f"budget {fake.budget_peak} of max_pool_bytes={MAX_POOL_BYTES}")
    assert fake.registrations == 1           # single flight: one extent, registered once
    assert fake.memory_made == 1             # ... and made once
    assert fake.peak_bytes <= MAX_POOL_BYTES
    assert fake.memory_peak <= MAX_POOL_BYTES
    assert 0 < fake.budget_peak <= MAX_POOL_BYTES
    assert_nothing_registered(fake)


def test_a_burst_of_cold_tasks_with_random_cancels_keeps_max_pool_bytes(fake_triton):
    fake = fake_triton
    fake.delays["send"] = 0.0005  # cancels land while requests are in the server, too
    rng = random.Random(17)

    async def main():
        async with await fake.aio_client(max_pool_bytes=MAX_POOL_BYTES) as c:
            await c.model_info("identity_fp32")
            inputs = [data(i) for i in range(BURST)]
            tasks = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": x})) for x in inputs]
            tasks[0].cancel()     # the first one makes the pool: it hands the work on
            cancelled = {0}
            for _ in range(BURST // 3):  # and a third more at random moments
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                i = rng.randrange(BURST)
                if tasks[i].cancel():
                    cancelled.add(i)
            done = await asyncio.gather(*tasks, return_exceptions=True)
            answered = 0
            for i, (x, out) in enumerate(zip(inputs, done)):
                if isinstance(out, asyncio.CancelledError):
                    assert i in cancelled
                    continue
                assert not isinstance(out, BaseException), out
                np.testing.assert_array_equal(out["OUTPUT0"], x)
                answered += 1
            assert len(c.pools()) == 1
            assert budget_used(c) <= MAX_POOL_BYTES
            return answered, len(cancelled)

    with fake.sampling():
        answered, cancelled = asyncio.run(main())
    print(f"\nasyncio: {answered} answered, {cancelled} cancelled, {fake.memory_made} extents made, "
          f"{fake.registrations} registered; peak registered {fake.peak_bytes}, alive {fake.memory_peak}, "
          f"budget {fake.budget_peak} of max_pool_bytes={MAX_POOL_BYTES}")
    assert answered > BURST // 2
    assert fake.peak_bytes <= MAX_POOL_BYTES
    assert fake.memory_peak <= MAX_POOL_BYTES
    assert 0 < fake.budget_peak <= MAX_POOL_BYTES
    assert_nothing_registered(fake)


# -- growth, retirement, replacement --------------------------------------------


def test_kept_results_grow_the_pool_up_to_max_pool_bytes_then_pool_exhausted(fake_triton):
    fake = fake_triton
    extent = 2 * SLOT  # slots=2
    with fake.client(slots=2, max_pool_bytes=3 * extent, slot_timeout=0.2) as c:
        kept = [c.infer("identity_fp32", {"INPUT0": data(i)}, copy=False)["OUTPUT0"] for i in range(6)]
        for i, view in enumerate(kept):
            np.testing.assert_array_equal(view, data(i))  # views of six slots of three extents
        (info,) = c.pools()
        assert (info.slots, info.held, info.nbytes, len(info.regions)) == (6, 6, 3 * extent, 3)
        assert fake.registered_bytes == 3 * extent
        with pytest.raises(PoolExhausted, match=rf"6 slots: 0 running, 6 held.*byte cap \({_nbytes(3 * extent)} of "
                                                rf"max_pool_bytes={3 * extent}\) with 6 slots held"):
            c.infer("identity_fp32", {"INPUT0": data(6)}, copy=False)
        del view
        kept.clear()  # the slots come back; the idle extents beyond the first go
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(7)})["OUTPUT0"], data(7))
        assert c.pools()[0].held == 0
    assert fake.peak_bytes == 3 * extent
    assert fake.budget_peak <= 3 * extent
    assert_nothing_registered(fake)


def test_a_larger_pool_replaces_the_old_one_without_both_over_the_cap(fake_triton):
    fake = fake_triton
    small, large = EXTENT, 2 * EXTENT
    with fake.client(max_pool_bytes=large) as c:
        a = data(1)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": a})["OUTPUT0"], a)
        (before,) = c.pools()
        assert before.nbytes == small
        b = data(2, 2 * ELEMENTS)  # 8 KiB in, 8 KiB out: 16 KiB slots
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": b})["OUTPUT0"], b)
        (after,) = c.pools()
        assert after.nbytes == large and after.regions != before.regions
        assert set(fake.registered) == set(after.regions)  # the old pool is gone from the server
    assert fake.peak_bytes <= large
    assert fake.memory_peak <= large
    assert fake.budget_peak <= large
    assert_nothing_registered(fake)


def test_a_burst_of_growing_requests_keeps_max_pool_bytes(fake_triton):
    """Concurrent requests of ever larger inputs replace the pool again and again."""
    fake = fake_triton
    cap = 4 * 65536

    def one(i):
        x = data(i, 256 * (1 + i % 8))
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)

    with fake.client(max_pool_bytes=cap) as c:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            for future in [pool.submit(one, i) for i in range(200)]:
                future.result()
        assert len(c.pools()) == 1
    print(f"\ngrowing: {fake.registrations} extents registered, peak {fake.peak_bytes} of {cap}")
    assert fake.peak_bytes <= cap
    assert fake.memory_peak <= cap
    assert fake.budget_peak <= cap
    assert_nothing_registered(fake)


def test_a_burst_that_keeps_results_grows_within_max_pool_bytes(fake_triton):
    """300 requests on 32 threads keep their results (copy=False views) for a while: the pool
    grows by extents for them, up to the cap and never past it; every answer is right."""
    fake = fake_triton
    fake.delays["send"] = 0.0002
    cap = 4 * EXTENT
    rng = random.Random(20)
    holds = [rng.random() * 0.002 for _ in range(BURST)]

    def one(i):
        x = data(i)
        view = c.infer("identity_fp32", {"INPUT0": x}, copy=False)["OUTPUT0"]
        threading.Event().wait(holds[i])  # the caller keeps the view a moment
        np.testing.assert_array_equal(view, x)

    with fake.client(max_pool_bytes=cap, slot_timeout=10.0) as c, fake.sampling():
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            for future in [pool.submit(one, i) for i in range(BURST)]:
                future.result()
        assert len(c.pools()) == 1
    print(f"\nkept views: {fake.memory_made} extents made, peak registered {fake.peak_bytes}, "
          f"alive {fake.memory_peak}, budget {fake.budget_peak} of max_pool_bytes={cap}")
    assert fake.memory_made > 1              # it did grow
    assert fake.peak_bytes <= cap
    assert fake.memory_peak <= cap
    assert fake.budget_peak <= cap
    assert_nothing_registered(fake)


def test_aio_a_burst_that_keeps_results_grows_within_max_pool_bytes(fake_triton):
    """The asyncio twin of the test above, without cancels (a task cancelled while its last
    steps drop a surplus extent has a test of its own, at the end: where a random cancel lands
    is a matter of timing)."""
    fake = fake_triton
    fake.delays["send"] = 0.0002
    cap = 4 * EXTENT

    async def main():
        async with await fake.aio_client(max_pool_bytes=cap, slot_timeout=10.0) as c:
            async def one(i):
                x = data(i)
                view = (await c.infer("identity_fp32", {"INPUT0": x}, copy=False))["OUTPUT0"]
                await asyncio.sleep(0.002 * (i % 3))  # the caller keeps the view a moment
                np.testing.assert_array_equal(view, x)

            await asyncio.gather(*(one(i) for i in range(BURST)))
            assert len(c.pools()) == 1

    with fake.sampling():
        asyncio.run(main())
    assert fake.memory_made > 1              # it did grow
    assert fake.peak_bytes <= cap
    assert fake.memory_peak <= cap
    assert fake.budget_peak <= cap
    assert_nothing_registered(fake)


def test_two_models_share_the_cap(fake_triton):
    fake = fake_triton
    with fake.client(max_pool_bytes=EXTENT, slot_timeout=0.2) as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(0)})["OUTPUT0"], data(0))
        two = {"INPUT0": np.ones(16, np.float32), "INPUT1": np.ones(16, np.float32)}
        with pytest.raises(PoolExhausted, match=rf"holds {_nbytes(EXTENT)} of max_pool_bytes={EXTENT}.*'identity_fp32'"):
            c.infer("add_sub", two)
    assert fake.peak_bytes <= EXTENT
    assert_nothing_registered(fake)


# -- fallbacks and failures -----------------------------------------------------


def test_registration_refused_falls_back_to_the_wire_with_a_warning(fake_triton):
    fake = fake_triton
    fake.refuse_registration()
    with fake.client() as c:
        x = data(3)
        with pytest.warns(RuntimeWarning, match="falling back to plain gRPC.*cannot open our shared memory"):
            out = c.infer("identity_fp32", {"INPUT0": x})
        np.testing.assert_array_equal(out["OUTPUT0"], x)
        batch = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(c.infer("batched_add", {"INPUT0": batch})["OUTPUT0"], batch + 1)
        assert c.pools() == []
        assert "wire" in repr(c)
    assert fake.calls["register"] == 1   # refused once; the client stays on the wire
    assert fake.peak_bytes == 0


def test_registration_refused_raises_for_transport_shm(fake_triton):
    fake = fake_triton
    fake.refuse_registration()
    with fake.client(transport="shm") as c:
        with pytest.raises(SharedMemoryRefused, match="cannot open our shared memory"):
            c.infer("identity_fp32", {"INPUT0": data(4)})
        assert c.pools() == []
        fake.refuse_registration(False)  # the server can open it now: the next request uses it
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(5)})["OUTPUT0"], data(5))
    assert_nothing_registered(fake)


def test_aio_registration_refused_falls_back_to_the_wire(fake_triton):
    fake = fake_triton
    fake.refuse_registration()

    async def main():
        async with await fake.aio_client() as c:
            with pytest.warns(RuntimeWarning, match="falling back to plain gRPC"):
                out = await c.infer("identity_fp32", {"INPUT0": data(6)})
            np.testing.assert_array_equal(out["OUTPUT0"], data(6))

    asyncio.run(main())
    assert fake.peak_bytes == 0


def test_a_failed_send_gives_its_slot_back(fake_triton):
    fake = fake_triton
    with fake.client() as c:
        c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.fail_next(2, ops=("send",))
        for _ in range(2):
            with pytest.raises(ServerError, match="injected failure"):
                c.infer("identity_fp32", {"INPUT0": data(1)})
        (info,) = c.pools()
        assert (info.running, info.held) == (0, 0)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(2)})["OUTPUT0"], data(2))
    assert_nothing_registered(fake)


def test_re_registration_after_a_restart(fake_triton):
    fake = fake_triton
    with fake.client() as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(0)})["OUTPUT0"], data(0))
        names = set(fake.registered)
        fake.restart()                     # the server forgot every region
        assert_nothing_registered(fake)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(1)})["OUTPUT0"], data(1))
        assert set(fake.registered) == names  # registered again under the same names
        assert fake.registrations == 2
    assert_nothing_registered(fake)


def test_a_dead_server_then_back(fake_triton):
    fake = fake_triton
    with fake.client() as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(0)})["OUTPUT0"], data(0))
        fake.die()
        with pytest.raises(ServerUnavailable):
            c.infer("identity_fp32", {"INPUT0": data(1)})
        fake.come_back()
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(2)})["OUTPUT0"], data(2))
        assert c.pools()[0].running == 0
    assert_nothing_registered(fake)


def test_aio_re_registration_after_a_restart(fake_triton):
    fake = fake_triton

    async def main():
        async with await fake.aio_client() as c:
            np.testing.assert_array_equal((await c.infer("identity_fp32", {"INPUT0": data(0)}))["OUTPUT0"], data(0))
            fake.restart()
            results = await asyncio.gather(*(c.infer("identity_fp32", {"INPUT0": data(i)}) for i in range(8)))
            for i, out in enumerate(results):
                np.testing.assert_array_equal(out["OUTPUT0"], data(i))
            assert len(fake.registered) == 1

    asyncio.run(main())
    assert_nothing_registered(fake)


# -- closing ---------------------------------------------------------------------


def test_close_asks_again_while_the_server_says_in_use(fake_triton):
    fake = fake_triton
    c = fake.client()
    c.infer("identity_fp32", {"INPUT0": data(0)})
    c.infer("add_sub", {"INPUT0": np.ones(16, np.float32), "INPUT1": np.ones(16, np.float32)})
    assert len(fake.registered) == 2
    fake.refuse_unregister(3)  # "currently in use" for a moment after the responses
    c.close()
    assert fake.calls["unregister"] >= 2 + 3
    assert_nothing_registered(fake)


def test_aio_close_asks_again_while_the_server_says_in_use(fake_triton):
    fake = fake_triton

    async def main():
        c = await fake.aio_client()
        await c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.refuse_unregister(3)
        await c.close()

    asyncio.run(main())
    assert fake.calls["unregister"] >= 1 + 3
    assert_nothing_registered(fake)


def test_close_waits_for_requests_stalled_in_the_server(fake_triton):
    fake = fake_triton
    c = fake.client(slot_timeout=10.0)
    c.infer("identity_fp32", {"INPUT0": data(0)})
    fake.stall()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(c.infer, "identity_fp32", {"INPUT0": data(i)}) for i in range(4)]
        assert fake.wait_stalled(4)
        closer = threading.Thread(target=c.close)
        closer.start()
        closer.join(0.1)
        assert closer.is_alive()            # waiting for the four requests
        assert len(fake.registered) == 1    # nothing unregistered under them
        with pytest.raises(ClientClosed):
            c.infer("identity_fp32", {"INPUT0": data(9)})  # new requests are refused at once
        threading.Timer(0.05, fake.release).start()
        closer.join(10)
        assert not closer.is_alive()
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result()["OUTPUT0"], data(i))
    assert_nothing_registered(fake)
    fake.check()  # no slot memory closed while registered


def test_aio_close_waits_for_tasks_stalled_in_the_server(fake_triton):
    fake = fake_triton

    async def main():
        c = await fake.aio_client(slot_timeout=10.0)
        await c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.stall()
        tasks = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(i)})) for i in range(4)]
        while not fake.wait_stalled(4, timeout=0):
            await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(c.close())
        await asyncio.sleep(0.05)
        assert not closing.done()
        assert len(fake.registered) == 1
        fake.release()
        await closing
        for i, task in enumerate(tasks):
            np.testing.assert_array_equal(task.result()["OUTPUT0"], data(i))

    asyncio.run(main())
    assert_nothing_registered(fake)


def test_a_forgotten_client_unregisters_at_garbage_collection(fake_triton):
    fake = fake_triton
    c = fake.client()
    c.infer("identity_fp32", {"INPUT0": data(0)})
    assert len(fake.registered) == 1
    del c
    gc.collect()
    assert_nothing_registered(fake)


# -- restarts and cancels in the middle of a burst -------------------------------


def test_a_restart_in_the_middle_of_a_burst(fake_triton):
    """Requests stalled in the server when it restarts find their regions gone: they register
    them again (once: the others see "already") and every one is answered."""
    fake = fake_triton
    with fake.client(max_pool_bytes=MAX_POOL_BYTES, slot_timeout=10.0) as c:
        c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.stall()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(c.infer, "identity_fp32", {"INPUT0": data(i)}) for i in range(64)]
            assert fake.wait_stalled(4)       # every slot is in the server
            fake.restart()
            fake.release()
            for i, future in enumerate(futures):
                np.testing.assert_array_equal(future.result()["OUTPUT0"], data(i))
        assert len(c.pools()) == 1
        assert len(fake.registered) == 1
    assert fake.peak_bytes <= MAX_POOL_BYTES
    assert fake.budget_peak <= MAX_POOL_BYTES
    assert_nothing_registered(fake)


def test_aio_a_burst_with_cancels_and_a_restart(fake_triton):
    fake = fake_triton
    rng = random.Random(19)

    async def main():
        async with await fake.aio_client(max_pool_bytes=MAX_POOL_BYTES) as c:
            inputs = [data(i) for i in range(BURST)]
            tasks = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": x})) for x in inputs]
            cancelled = set()
            for turn in range(BURST // 3):
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                if turn == BURST // 6:
                    fake.restart()
                i = rng.randrange(BURST)
                if tasks[i].cancel():
                    cancelled.add(i)
            done = await asyncio.gather(*tasks, return_exceptions=True)
            for i, (x, out) in enumerate(zip(inputs, done)):
                if isinstance(out, asyncio.CancelledError):
                    assert i in cancelled
                    continue
                assert not isinstance(out, BaseException), out
                np.testing.assert_array_equal(out["OUTPUT0"], x)
            assert len(c.pools()) == 1

    asyncio.run(main())
    assert fake.peak_bytes <= MAX_POOL_BYTES
    assert fake.memory_peak <= MAX_POOL_BYTES
    assert fake.budget_peak <= MAX_POOL_BYTES
    assert_nothing_registered(fake)


def test_aio_the_creator_cancelled_while_it_registers_hands_on(fake_triton):
    """The first request (the pool's creator) is cancelled while its registration is in the
    server: the registration finishes, the extent joins the pool, the others are served by it."""
    fake = fake_triton
    fake.delays["register"] = 0.02

    async def main():
        async with await fake.aio_client(max_pool_bytes=MAX_POOL_BYTES) as c:
            await c.model_info("identity_fp32")
            creator = asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(0)}))
            others = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(i)})) for i in range(1, 50)]
            while fake.begun["register"] == 0:  # counted as it begins: in the server now
                await asyncio.sleep(0)
            creator.cancel()
            with pytest.raises(asyncio.CancelledError):
                await creator
            for i, out in enumerate(await asyncio.gather(*others), 1):
                np.testing.assert_array_equal(out["OUTPUT0"], data(i))
            assert len(c.pools()) == 1

    asyncio.run(main())
    assert fake.registrations == 1
    assert fake.peak_bytes <= MAX_POOL_BYTES
    assert_nothing_registered(fake)


def test_a_registration_that_fails_leaves_no_pool_and_the_next_request_makes_one(fake_triton):
    fake = fake_triton
    with fake.client(max_pool_bytes=MAX_POOL_BYTES) as c:
        fake.fail_next(1, ops=("register",))
        with pytest.raises(ServerError, match="injected failure"):
            c.infer("identity_fp32", {"INPUT0": data(0)})
        assert c.pools() == []
        assert budget_used(c) == 0      # the memory made for it is closed, its bytes back
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(1)})["OUTPUT0"], data(1))
    assert_nothing_registered(fake)


def test_a_request_answered_after_close_gave_up_on_it_gets_a_tritonshm_error(monkeypatch):
    fake = FakeTriton.install(monkeypatch)  # not the fixture: closing under the server is the point
    try:
        c = fake.client(slot_timeout=0.1)
        c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.stall()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(c.infer, "identity_fp32", {"INPUT0": data(1)})
            assert fake.wait_stalled(1)
            c.close()      # waits 0.1 s for the request, is told "in use" for 0.1 s more, gives up
            fake.release()  # the server answers, having written into its own mapping
            with pytest.raises(tritonshm.ClientClosed, match="closed while this request"):
                future.result()
    finally:
        fake.shutdown()


# -- the other paths: zero-copy requests, chunks, output growth ---------------------


def test_zero_copy_requests_and_chunked_batches(fake_triton):
    fake = fake_triton
    with fake.client(max_pool_bytes=1 << 20) as c:
        with c.request("batched_add", 3) as req:
            req.inputs["INPUT0"][...] = np.arange(12, dtype=np.float32).reshape(3, 4)
            out = req.run()["OUTPUT0"]
            np.testing.assert_array_equal(out, np.arange(12, dtype=np.float32).reshape(3, 4) + 1)
            del out
        batch = np.arange(20 * 4, dtype=np.float32).reshape(20, 4)  # 3 chunks of at most 8, on workers
        np.testing.assert_array_equal(c.infer("batched_add", {"INPUT0": batch})["OUTPUT0"], batch + 1)
        futures = [c.infer_async("add_sub", {"INPUT0": data(i, 16), "INPUT1": data(i + 1, 16)}) for i in range(8)]
        for i, future in enumerate(futures):
            out = future.result()
            np.testing.assert_array_equal(out["OUTPUT0"], data(i, 16) + data(i + 1, 16))
            np.testing.assert_array_equal(out["OUTPUT1"], data(i, 16) - data(i + 1, 16))
    assert_nothing_registered(fake)


def test_a_slot_comes_back_when_its_last_view_goes_and_leaves_nothing_behind(fake_triton):
    """A zero-copy request's slot is back in its pool as soon as the request and every view of it
    are gone -- on whichever thread drops the last one -- and the pool's table of leases lets go
    of it then, also for a view kept past the client's close()."""
    from tritonshm.client import _pool

    fake = fake_triton
    before = len(_pool._leased)
    with fake.client(max_pool_bytes=1 << 20) as c:
        with c.request("batched_add", 3) as req:
            req.inputs["INPUT0"][...] = 1
            out = req.run()["OUTPUT0"]
        pool = live_pool(c, "batched_add")
        assert (pool.running, pool.held, len(_pool._leased)) == (0, 1, before + 1)
        views = [out]
        del out
        dropper = threading.Thread(target=views.clear)  # the last view goes on another thread
        dropper.start()
        dropper.join()
        assert (pool.running, pool.held, len(_pool._leased)) == (0, 0, before)
        with c.request("batched_add", 3) as req:
            kept = req.run()["OUTPUT0"]
    assert len(_pool._leased) == before + 1
    del kept
    assert len(_pool._leased) == before
    assert_nothing_registered(fake)


def test_an_output_larger_than_guessed_grows_the_pool(fake_triton):
    """The server says the bound output room is too small (OutputTooSmall with the size): the
    request runs again on a slot of a larger pool, which replaces the old one within the cap."""
    fake = fake_triton
    with fake.client(max_pool_bytes=1 << 20) as c:
        x = data(7)
        np.testing.assert_array_equal(c.infer("repeat_fp32", {"INPUT0": x})["OUTPUT0"], np.concatenate([x] * 3))
        np.testing.assert_array_equal(c.infer("repeat_fp32", {"INPUT0": x})["OUTPUT0"], np.concatenate([x] * 3))
        assert len(c.pools()) == 1
        assert fake.calls["send"] == 3  # once too small, then twice on the grown pool
    assert fake.peak_bytes <= 1 << 20
    assert_nothing_registered(fake)


def test_aio_close_waits_for_cancelled_tasks_the_server_still_runs(fake_triton):
    """Tasks cancelled while the server works on them keep their slots until it answers;
    close() must not unregister those regions under the server meanwhile."""
    fake = fake_triton

    async def main():
        c = await fake.aio_client(slot_timeout=10.0)
        await c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.stall()
        tasks = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(i)})) for i in range(4)]
        while not fake.wait_stalled(4, timeout=0):
            await asyncio.sleep(0.001)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closing = asyncio.ensure_future(c.close())
        await asyncio.sleep(0.05)
        assert len(fake.registered) == 1     # still registered: the server still has it in use
        fake.release()
        await closing

    asyncio.run(main())
    assert fake.calls["unregister"] == 1     # never refused "in use": close waited
    assert_nothing_registered(fake)


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_a_registration_cut_off_though_carried_out_is_unregistered_before_its_memory_goes(fake_triton, aio):
    """A new slot region's registration whose answer did not come in time (a client_timeout, a
    lost connection) may have been carried out: its name is unregistered before its memory is
    closed -- never a region the server maps freed under it, nor a name left registered."""
    fake = fake_triton
    fake.cut_off_registrations()

    async def main() -> None:
        c = await fake.aio_client() if aio else fake.client()
        with pytest.raises(tritonshm.ServerTimeout):
            got = c.infer("identity_fp32", {"INPUT0": data(0)})
            await got if aio else got
        got = c.infer("identity_fp32", {"INPUT0": data(1)})  # (a region of its own: the next request's)
        np.testing.assert_array_equal((await got if aio else got)["OUTPUT0"], data(1))
        await c.close() if aio else c.close()

    asyncio.run(main())
    assert_nothing_registered(fake)  # (and no memory freed while registered: the fixture's check)


def test_an_aio_call_cancelled_while_its_registration_is_cut_off_unregisters_it_before_its_memory_goes(
        fake_triton):
    """The caller is cancelled while a new slot region's registration is out, and that call is
    then cut off though the server carried it out: its failure still reaches the steps (not
    only a success does), which unregister the name before the memory goes."""
    fake = fake_triton
    fake.delays["register"] = 0.2
    fake.cut_off_registrations()

    async def main() -> None:
        c = await fake.aio_client()
        call = asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(0)}))
        while not fake.begun["register"]:
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.4)  # (the registration's outcome came, and was handed to the steps)
        await c.close()

    asyncio.run(main())
    assert_nothing_registered(fake)  # (and no memory freed while registered: the fixture's check)


def test_close_against_a_dead_server_is_quick_and_frees_the_memory(fake_triton):
    fake = fake_triton
    c = fake.client()
    c.infer("identity_fp32", {"INPUT0": data(0)})
    fake.die()  # a server that is gone has let go of everything
    c.close()
    assert budget_used(c) == 0
    assert_nothing_registered(fake)


def test_a_forgotten_aio_client_unregisters_at_garbage_collection(fake_triton):
    fake = fake_triton

    async def main():
        c = await fake.aio_client()
        await c.infer("identity_fp32", {"INPUT0": data(0)})
        assert len(fake.registered) == 1

    asyncio.run(main())
    gc.collect()
    assert_nothing_registered(fake)


def test_a_larger_pool_blocked_by_kept_results_gets_pool_exhausted_in_time(fake_triton):
    fake = fake_triton
    with fake.client(max_pool_bytes=2 * EXTENT, slot_timeout=0.2) as c:
        kept = [c.infer("identity_fp32", {"INPUT0": data(0)}, copy=False)["OUTPUT0"]]
        outcome = []

        def larger():  # 16 KiB slots: the new pool and the old one do not fit together
            try:
                outcome.append(c.infer("identity_fp32", {"INPUT0": data(1, 2 * ELEMENTS)}))
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=larger)
        thread.start()
        thread.join(2.0)
        finished_in_time = not thread.is_alive()
        kept.clear()  # lets a spinning request go on (the old pool drains), so the test ends
        thread.join(10.0)
        assert finished_in_time, "the request (timeout 0.2 s) had not ended after 2 s"
        assert isinstance(outcome[0], PoolExhausted), outcome
    assert fake.peak_bytes <= 2 * EXTENT


def test_aio_a_larger_pool_blocked_by_kept_results_gets_pool_exhausted_in_time(fake_triton):
    fake = fake_triton

    async def main():
        async with await fake.aio_client(max_pool_bytes=2 * EXTENT, slot_timeout=0.2) as c:
            kept = [(await c.infer("identity_fp32", {"INPUT0": data(0)}, copy=False))["OUTPUT0"]]
            rescue = threading.Timer(1.0, kept.clear)  # a spinning loop blocks the event loop: drop them from a thread
            rescue.start()
            try:
                with pytest.raises(PoolExhausted):
                    await c.infer("identity_fp32", {"INPUT0": data(1, 2 * ELEMENTS)})
                assert rescue.is_alive(), "the event loop was blocked until the results were dropped"
            finally:
                rescue.cancel()
                kept.clear()

    asyncio.run(main())
    assert fake.peak_bytes <= 2 * EXTENT


def test_aio_a_request_cancelled_while_it_drops_a_surplus_extent_frees_it(monkeypatch):
    fake = FakeTriton.install(monkeypatch)  # not the fixture: the leak is checked below, then cleaned up
    slot = SLOT

    async def main():
        async with await fake.aio_client(slots=1, max_pool_bytes=4 * slot) as c:
            kept = (await c.infer("identity_fp32", {"INPUT0": data(0)}, copy=False))["OUTPUT0"]
            await c.infer("identity_fp32", {"INPUT0": data(1)})  # no free slot, one held: grows
            assert c.pools()[0].nbytes == 2 * slot
            del kept                                # the second extent is idle surplus now
            fake.delays["unregister"] = 0.05
            unregisters = fake.begun["unregister"]
            task = asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": data(2)}))
            while fake.begun["unregister"] == unregisters:  # its last steps drop the surplus (counted
                # when it starts: a call is counted in `calls` only after its delay, when the task may be done)
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.1)                # the Unregister finishes meanwhile
            fake.delays.clear()
            # The engine may not know whether the server let go (the outcome went with the
            # cancel): asking again later is fine, so the next request gets the chance to.
            await c.infer("identity_fp32", {"INPUT0": data(3)})
            return budget_used(c)

    try:
        used = asyncio.run(main())
        left_open = fake.memory_bytes
    finally:
        fake.shutdown()
    assert used == slot, f"the budget still counts {used} bytes for a pool of {slot} after the next request"
    assert left_open == 0, f"{left_open} bytes of slot memory never closed"


# -- the quick path: small requests seen before ---------------------------------------------


def test_a_small_request_seen_before_is_not_planned_again(fake_triton, monkeypatch):
    with fake_triton.client() as c:
        planned = record_plans(monkeypatch, c)
        for seed in range(5):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(seed)})["OUTPUT0"], data(seed))
        assert planned == ["identity_fp32"]  # then quick: same model, outputs, dtypes and shapes
        c.infer("identity_fp32", {"INPUT0": data(0, ELEMENTS // 2)})  # other shapes: planned
        c.infer("identity_fp32", {"INPUT0": data(0)}, outputs=["OUTPUT0"])  # other outputs asked for
        assert planned == ["identity_fp32"] * 3
        # What the quick path never takes: checked and planned every time.
        with pytest.raises(tritonshm.DTypeMismatch):
            c.infer("identity_fp32", {"INPUT0": data(0).astype(np.float64)})
        strided = np.repeat(data(1), 2)[::2]
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": strided})["OUTPUT0"], data(1))
        with pytest.raises(tritonshm.DTypeMismatch):  # a list of floats is float64: no silent casts
            c.infer("identity_fp32", {"INPUT0": data(2).tolist()})
        c.infer("identity_fp32", {"INPUT0": data(3)}, copy=False)
        assert planned == ["identity_fp32"] * 7
    assert_nothing_registered(fake_triton)


def test_options_ride_the_quick_path_each_with_its_own_request(fake_triton, monkeypatch):
    """A small request seen before is not planned again, with options or without
    (options=RequestOptions() is none: what tritonshm.grpc / .http pass on every call); options
    are checked on every call, and each request takes its own to the server."""
    with fake_triton.client() as c:
        planned = record_plans(monkeypatch, c)
        for seed in range(4):
            out = c.infer("identity_fp32", {"INPUT0": data(seed)}, options=tritonshm.RequestOptions())
            np.testing.assert_array_equal(out["OUTPUT0"], data(seed))
        for seed, priority in ((4, 3), (5, 7), (6, None)):
            options = {} if priority is None else {"priority": priority}
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(seed)}, **options)["OUTPUT0"],
                                          data(seed))
        assert planned == ["identity_fp32"]
        priorities = [seen["priority"].uint64_param if "priority" in seen else None
                      for seen in fake_triton.parameters_seen]
        assert priorities == [None] * 4 + [3, 7, None]
        with pytest.raises(tritonshm.InvalidOption):  # checked before anything is sent, quick or not
            c.infer("identity_fp32", {"INPUT0": data(0)}, priority=-1)
        assert len(fake_triton.parameters_seen) == 7
    assert_nothing_registered(fake_triton)


def test_quick_requests_go_the_full_way_after_a_restart_and_when_the_pool_is_busy(fake_triton, monkeypatch):
    with fake_triton.client(slots=1) as c:
        planned = record_plans(monkeypatch, c)
        c.infer("identity_fp32", {"INPUT0": data(0)})
        fake_triton.restart()  # every registration forgotten: the quick Send is refused, then healed
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(1)})["OUTPUT0"], data(1))
        kept = c.infer("identity_fp32", {"INPUT0": data(2)}, copy=False)["OUTPUT0"]  # holds the one slot
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(3)})["OUTPUT0"], data(3))
        np.testing.assert_array_equal(kept, data(2))
        assert planned == ["identity_fp32", "identity_fp32"]  # the first, and the copy=False one
        del kept


def test_quick_requests_from_many_threads_keep_their_data_apart(fake_triton):
    with fake_triton.client(slots=2) as c:
        c.infer("identity_fp32", {"INPUT0": data(0)})

        def one(seed):
            x = data(seed)
            return np.array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(one, range(400)))
    assert_nothing_registered(fake_triton)


def test_a_quick_request_asking_for_every_output_by_an_empty_list_runs_after_a_restart(fake_triton):
    def every_output(seed):  # outputs=[]: every output, as tritonclient's (it sends no list)
        result = c.infer("identity_fp32", {"INPUT0": data(seed)}, outputs=[])
        return list(result) == ["OUTPUT0"] and np.array_equal(result["OUTPUT0"], data(seed))

    with fake_triton.client() as c:
        for _ in range(2):  # planned, then quick
            assert every_output(0)
        fake_triton.restart()  # every registration forgotten
        sends, registers = fake_triton.calls["send"], fake_triton.calls["register"]
        assert every_output(1)
        # The quick Send refused, then the full way: refused, registered again, run.
        assert fake_triton.calls["send"] - sends == 3 and fake_triton.calls["register"] > registers


# -- a pool that max_pool_bytes cannot hold -------------------------------------


@pytest.mark.parametrize("slots, max_pool_bytes, elements, advice", [
    # one slot alone is over the cap: only max_pool_bytes helps, whatever slots= is
    (1, SLOT // 2, ELEMENTS, rf"is {_nbytes(SLOT)}, more than the client's {_cap(SLOT // 2)} on its own: "
                             rf"make the client with max_pool_bytes={SLOT} or more \(fewer slots would not help\)"),
    (4, SLOT // 2, ELEMENTS, rf"is {_nbytes(SLOT)}, more than the client's {_cap(SLOT // 2)} on its own"),
    # the slots together are: fewer slots, or a higher cap
    (4, 3 * SLOT, ELEMENTS, rf"is {_nbytes(SLOT)}; slots=4 of them need {_nbytes(4 * SLOT)}, more than the "
                            rf"client's {_cap(3 * SLOT)}: make the client with slots=3 \(what fits\) or "
                            rf"max_pool_bytes={4 * SLOT} or more"),
    # the defaults (slots=4, 1 GiB): a 160 MiB request's slot is 320 MiB, four of them 1.25 GiB
    (None, None, 40 << 20, rf"is {_nbytes(335544320)}; slots=4 of them need {_nbytes(1342177280)}, more than the "
                           rf"client's {_cap(1073741824)}: make the client with slots=3 \(what fits\)"),
    # a 600 MiB request with the defaults: a 1.2 GiB slot
    (None, None, 150 << 20, rf"is {_nbytes(1258291200)}, more than the client's {_cap(1073741824)} on its own: "
                            r"make the client with max_pool_bytes=1258291200 or more"),
])
def test_a_pool_over_max_pool_bytes_names_the_setting_that_would_fit_it(fake_triton, slots, max_pool_bytes,
                                                                       elements, advice):
    settings = {k: v for k, v in (("slots", slots), ("max_pool_bytes", max_pool_bytes)) if v is not None}
    with fake_triton.client(**settings) as c:
        x = np.zeros(elements, np.float32)  # pages untouched: nothing is copied before the pool is refused
        with pytest.raises(tritonshm.InvalidOption, match=f"a slot of model 'identity_fp32' .*{advice}"):
            c.infer("identity_fp32", {"INPUT0": x})
    assert_nothing_registered(fake_triton)


def test_a_slot_the_client_gave_up_on_comes_back_only_once_the_server_let_go_of_it(fake_triton):
    """The client stops waiting for a request (client_timeout) while the server goes on: its slot
    stays out of the pool -- the next requests get other slots, and the late write of the old
    request never lands in their inputs or results -- until the server is done with it (it
    refuses to unregister the region meanwhile); then the slot serves again."""
    fake = fake_triton
    with fake.client(slots=2, max_pool_bytes=MAX_POOL_BYTES) as c:
        c.infer("identity_fp32", {"INPUT0": data(0)})
        fake.stall()
        fake.client_gives_up_after = 0.05
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("identity_fp32", {"INPUT0": data(1)})
        assert c.stats().abandoned == 1
        pool = live_pool(c, "identity_fp32")
        assert [p.awaiting_server for p in c.pools()] == [2]  # its extent is out of leasing: both slots
        fake.client_gives_up_after = None
        fake.release()  # the late request runs now and writes into its slot
        wait_for(lambda: fake.late_writes == 1)
        for i in range(2, 12):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(i)})["OUTPUT0"], data(i))
        # the server let go of it (it agreed to unregister the region): its extent serves again
        wait_for(lambda: (c.infer("identity_fp32", {"INPUT0": data(0)}), c.pools()[0].awaiting_server)[1] == 0)
        assert free_slots(pool) == pool.nslots
    fake.check()


def wait_for(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_misused_calls_of_a_request_seen_before_get_the_full_way_s_errors(fake_triton):
    """The quick path looks a call up before any check: a call it cannot look up (an unhashable
    model or output name) goes the full way, which says what is wrong."""
    with fake_triton.client() as c:
        c.infer("identity_fp32", {"INPUT0": data(0)})
        with pytest.raises(tritonshm.InvalidOption, match="model name"):
            c.infer(["identity_fp32"], {"INPUT0": data(0)})
        with pytest.raises(tritonshm.Error):
            c.infer("identity_fp32", {"INPUT0": data(0)}, outputs=[["OUTPUT0"]])
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data(1)})["OUTPUT0"], data(1))
    assert_nothing_registered(fake_triton)
