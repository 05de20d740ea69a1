"""Bursts of cold requests against one fresh client: one pool is made, max_pool_bytes holds.

A web service that receives a few hundred concurrent requests just after it
started sends them all to a client with no pool yet.  Each used to make and
register a pool of its own (only one was kept): 179 extents of 128 MiB in
one run.  Pool creation is single-flight now: these tests count the slot
memory alive at every instant (every extent made, registered or on its way)
and check its peak against ``max_pool_bytes``, with a real Triton server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import numpy as np
import pytest

import tritonshm
import tritonshm.aio

from support.insides import meter_slot_memory
from triton_fixtures import sample

BURST = 300
ELEMENTS = 1024                      # 4 KiB in, 4 KiB out: 8 KiB slots, 32 KiB extents of 4 slots
MAX_POOL_BYTES = 2 * 4 * 8192        # room for the pool and one extent of growth, not for 300 pools


@pytest.fixture
def slot_memory_peak(monkeypatch):
    """Tracks the bytes of host slot memory alive (made and not yet closed); yields the meter
    (``live``, ``peak``, ``made``)."""
    meter = meter_slot_memory(monkeypatch)
    yield meter
    assert meter.live == 0, "slot memory left open after the client closed"


def url_of(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else f"http://{server.http_url}"


@pytest.mark.parametrize("protocol", ["grpc", "http"])  # HTTP: every request on a socket of its thread
def test_a_burst_of_cold_threads_makes_one_pool(server, slot_memory_peak, protocol):
    with tritonshm.Client(url_of(server, protocol), max_pool_bytes=MAX_POOL_BYTES) as c:
        c.model_info("identity_fp32")  # metadata first: the burst is about pools
        start = threading.Barrier(BURST)

        def one(i):
            data = sample(np.float32, ELEMENTS, seed=i)
            start.wait()
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)

        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            for future in [pool.submit(one, i) for i in range(BURST)]:
                future.result()
        assert len(c.pools()) == 1
    print(f"\nthreads: {BURST} cold requests, {slot_memory_peak.made} extents made, "
          f"peak {slot_memory_peak.peak} bytes of max_pool_bytes={MAX_POOL_BYTES}")
    assert slot_memory_peak.peak <= MAX_POOL_BYTES
    assert slot_memory_peak.made == 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])  # HTTP: cancels in the middle of the loop's sockets
def test_a_burst_of_cold_tasks_with_random_cancels_keeps_max_pool_bytes(server, slot_memory_peak, protocol):
    rng = random.Random(17)

    async def main():
        async with tritonshm.aio.Client(url_of(server, protocol), max_pool_bytes=MAX_POOL_BYTES) as c:
            await c.model_info("identity_fp32")
            datas = [sample(np.float32, ELEMENTS, seed=i) for i in range(BURST)]
            tasks = [asyncio.ensure_future(c.infer("identity_fp32", {"INPUT0": d})) for d in datas]
            cancelled = set()
            for _ in range(BURST // 3):  # cancel a third of them at random moments, the creator too
                await asyncio.sleep(rng.random() * 0.002)
                i = rng.randrange(BURST)
                if tasks[i].cancel():
                    cancelled.add(i)
            done = await asyncio.gather(*tasks, return_exceptions=True)
            answered = 0
            for i, (data, out) in enumerate(zip(datas, done)):
                if isinstance(out, asyncio.CancelledError):
                    assert i in cancelled
                    continue
                assert not isinstance(out, BaseException), out
                np.testing.assert_array_equal(out["OUTPUT0"], data)
                answered += 1
            assert len(c.pools()) == 1
            return answered

    answered = asyncio.run(main())
    print(f"\nasyncio: {BURST} cold requests ({BURST - answered} cancelled), {slot_memory_peak.made} "
          f"extents made, peak {slot_memory_peak.peak} bytes of max_pool_bytes={MAX_POOL_BYTES}")
    assert answered > 0
    assert slot_memory_peak.peak <= MAX_POOL_BYTES


def test_a_larger_pool_waits_for_the_one_it_replaces_to_go(server, slot_memory_peak):
    """A request that outgrows the pool gets a larger one; max_pool_bytes has room for one of
    them only: the old one is retired and dropped first, never both alive at once."""
    small, large = 4 * 8192, 4 * 16384
    with tritonshm.Client(server.grpc_url, max_pool_bytes=large) as c:
        a = sample(np.float32, ELEMENTS)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": a})["OUTPUT0"], a)
        assert c.pools()[0].nbytes == small
        b = sample(np.float32, 2 * ELEMENTS, seed=1)  # 8 KiB in, 8 KiB out: 16 KiB slots
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": b})["OUTPUT0"], b)
        assert [p.nbytes for p in c.pools()] == [large]
    assert slot_memory_peak.peak <= large


def test_max_pool_bytes_is_for_the_whole_client(server, slot_memory_peak):
    """Two models, room for one pool: the second model's request waits for room, then gets
    PoolExhausted saying what holds the bytes -- never a second pool over the cap."""
    with tritonshm.Client(server.grpc_url, max_pool_bytes=4 * 8192, slot_timeout=0.2) as c:
        a = sample(np.float32, ELEMENTS)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": a})["OUTPUT0"], a)
        with pytest.raises(tritonshm.PoolExhausted, match=r"holds 32768 bytes \(32 KiB\) of max_pool_bytes=32768.*'identity_fp32'"):
            c.infer("identity_int32", {"INPUT0": np.arange(ELEMENTS, dtype=np.int32)})
    assert slot_memory_peak.peak <= 4 * 8192


def test_a_burst_of_growing_requests_keeps_max_pool_bytes(server, slot_memory_peak):
    """Concurrent requests of ever larger inputs replace the pool again and again: the bytes
    alive (old pools draining, new ones registering) stay within max_pool_bytes throughout."""
    cap = 4 * 65536

    def one(i):
        data = sample(np.float32, 256 * (1 + i % 8), seed=i)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)

    with tritonshm.Client(server.grpc_url, max_pool_bytes=cap) as c:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            for future in [pool.submit(one, i) for i in range(200)]:
                future.result()
    print(f"\ngrowing: 200 requests of 1 to 8 KiB, {slot_memory_peak.made} extents made, "
          f"peak {slot_memory_peak.peak} bytes of max_pool_bytes={cap}")
    assert slot_memory_peak.peak <= cap


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_larger_pool_is_not_starved_by_the_models_smaller_requests(server, slot_memory_peak, protocol):
    """A request outgrows its model's pool under max_pool_bytes that holds the larger pool alone,
    while other threads keep sending the model's small requests.  The larger pool is in service at
    once, and they wait for its slots: before, finding no pool while it waited for the old one's
    bytes, each made a fresh small pool that took them back, until its slot_timeout
    (PoolExhausted)."""
    small, large = sample(np.float32, 1024), sample(np.float32, 4096)  # 8 KiB and 32 KiB slots
    cap = 64 << 10  # two slots of the larger pool: nothing beside it
    with tritonshm.Client(url_of(server, protocol), slots=2, max_pool_bytes=cap, slot_timeout=10) as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": small})["OUTPUT0"], small)
        stop, failures = threading.Event(), []

        def small_requests():
            while not stop.is_set():
                try:
                    np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": small})["OUTPUT0"], small)
                except BaseException as exc:  # noqa: BLE001 (reported below)
                    failures.append(exc)
                    return

        others = [threading.Thread(target=small_requests) for _ in range(3)]
        for thread in others:
            thread.start()
        try:
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": large})["OUTPUT0"], large)
        finally:
            stop.set()
            for thread in others:
                thread.join()
        assert failures == []
    assert slot_memory_peak.peak <= cap
