"""tritonshm.aio.Client against a real Triton server."""

from __future__ import annotations

import asyncio
import gc
import mmap

import numpy as np
import pytest

import tritonshm
from tritonshm.client._slots import SYSTEM, SlotKind  # noqa: F401 (the private pool keys)
import tritonshm.aio
from triton_fixtures import client_url
from support.insides import live_pool, tritonclient_url_and_verbose


def run(coro):
    return asyncio.run(coro)


def test_aio_infer_chunks_concurrently_and_checks_inputs(server, protocol):
    async def scenario():
        async with tritonshm.aio.Client(client_url(server, protocol)) as c:
            x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
            out = await c.infer("batched_fp32", {"INPUT0": x})
            assert np.array_equal(out["OUTPUT0"], x * 2)
            # many requests in flight at once on one event loop
            data = [np.full(64, i, np.float32) for i in range(20)]
            results = await asyncio.gather(*(c.infer("identity_fp32", {"INPUT0": d}) for d in data))
            assert all(np.array_equal(r["OUTPUT0"], d) for r, d in zip(results, data))
            with pytest.raises(tritonshm.DTypeMismatch, match="INPUT0"):
                await c.infer("identity_fp32", {"INPUT0": np.zeros(3)})
            view = (await c.infer("identity_fp32", {"INPUT0": data[3]}, copy=False))["OUTPUT0"]
            assert not view.flags.owndata and np.array_equal(view, data[3])
            assert isinstance(c.tritonclient, object)
        assert np.array_equal(view, data[3])  # outlives the client

    run(scenario())


def test_aio_pool_exhaustion_waits_without_blocking_the_loop(server):
    async def scenario():
        async with tritonshm.aio.Client(server.grpc_url, slots=1, max_pool_bytes=mmap.PAGESIZE) as c:
            held = await c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)}, copy=False)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            with pytest.raises(tritonshm.PoolExhausted):
                await c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)}, slot_timeout=0.3)
            task.cancel()
            assert ticks > 3  # the loop kept running while we waited for a slot
            del held

    run(scenario())


def test_aio_honours_tls_and_verbose(server):
    """An https:// URL must not infer in plaintext: the aio client is built with TLS."""
    async def scenario():
        c = tritonshm.aio.Client("https://" + server.http_url.split("://")[-1], verbose=True)
        try:
            url, verbose = tritonclient_url_and_verbose(c.tritonclient)
            assert url.startswith("https://") and verbose
            with pytest.raises(tritonshm.ServerError):  # the server speaks plain HTTP only
                await c.model_info("identity_fp32")
        finally:
            await c.close()
        g = tritonshm.aio.Client("grpcs://" + server.grpc_url, connect_options={"root_certificates": None})
        try:
            with pytest.raises(tritonshm.ServerError):  # a TLS handshake with a plaintext server fails
                await g.model_info("identity_fp32")
        finally:
            await g.close()

    run(scenario())


def test_aio_cancelled_request_keeps_its_slot_until_the_server_is_done(server, protocol):
    async def scenario():
        async with tritonshm.aio.Client(client_url(server, protocol), slots=1) as c:
            data = np.arange(8, dtype=np.float32)
            await c.infer("slow_fp32", {"INPUT0": data})  # make the pool
            pool = live_pool(c, "slow_fp32")
            task = asyncio.create_task(c.infer("slow_fp32", {"INPUT0": data}))
            await asyncio.sleep(0.2)  # the server is working on it now
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The server may still write into the slot: it is not free yet.
            assert pool.running == 1 and pool.try_acquire() is None
            for _ in range(200):
                await asyncio.sleep(0.05)
                gc.collect()
                if pool.running == 0:
                    break
            assert pool.running == 0 and pool.held == 0
            out = await c.infer("slow_fp32", {"INPUT0": data + 1}, slot_timeout=5)
            assert np.array_equal(out["OUTPUT0"], data + 1)

    run(scenario())


def test_aio_cancelled_while_waiting_for_a_slot_leaves_counts_right(server):
    async def scenario():
        async with tritonshm.aio.Client(server.grpc_url, slots=1) as c:
            data = np.arange(4, dtype=np.float32)
            first = asyncio.create_task(c.infer("slow_fp32", {"INPUT0": data}))
            await asyncio.sleep(0.2)
            pool = live_pool(c, "slow_fp32")
            waiting = asyncio.create_task(c.infer("slow_fp32", {"INPUT0": data}))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert np.array_equal((await first)["OUTPUT0"], data)
            gc.collect()
            assert pool.running == 0 and pool.held == 0 and pool.nslots == 1
            assert np.array_equal((await c.infer("slow_fp32", {"INPUT0": data}, slot_timeout=5))["OUTPUT0"], data)

    run(scenario())


def test_aio_a_port_of_the_other_protocol_is_named_as_the_likely_mistake(server):
    async def main():
        x = {"INPUT0": np.zeros(4, np.float32)}
        for url, hint in ((server.http_url, r"the server's HTTP port\?.*give http://"),
                          ("http://" + server.grpc_url, r"is it the server's gRPC port\?.*without http://")):
            async with tritonshm.aio.Client(url) as c:
                with pytest.raises(tritonshm.ServerUnavailable, match=hint):
                    await c.infer("identity_fp32", x)

    run(main())


def test_aio_close_ends_a_request_in_flight_with_client_closed_and_a_cancelled_one_stays_cancelled(
        server, protocol):
    """close() gives up waiting (slot_timeout) for a request the server still runs: the request
    raises ClientClosed on both protocols, never a CancelledError nobody asked for (a TaskGroup
    or asyncio.wait_for would take it for its own); a task its caller cancelled while the client
    closed still raises CancelledError (issue 38, case 8)."""
    async def scenario():
        c = tritonshm.aio.Client(client_url(server, protocol), slot_timeout=0.1)
        data = np.arange(8, dtype=np.float32)
        await c.infer("slow_fp32", {"INPUT0": data})  # the model known, its pool made
        running = asyncio.create_task(c.infer("slow_fp32", {"INPUT0": data}))
        cancelled = asyncio.create_task(c.infer("slow_fp32", {"INPUT0": data + 1}))
        await asyncio.sleep(0.2)  # the server works on the one, the other waits in its queue
        closing = asyncio.create_task(c.close())
        await asyncio.sleep(0.05)  # close() waits for them (0.1 s)
        cancelled.cancel()
        await closing
        with pytest.raises(tritonshm.ClientClosed):
            await running
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    run(scenario())
