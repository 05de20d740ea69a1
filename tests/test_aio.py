"""tritonshm.aio.Client against a real Triton server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from triton_fixtures import client_url


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
        async with tritonshm.aio.Client(server.grpc_url, slots=1) as c:
            held = await c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)}, copy=False)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            with pytest.raises(tritonshm.PoolExhausted):
                await c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)}, timeout=0.3)
            task.cancel()
            assert ticks > 3  # the loop kept running while we waited for a slot
            del held

    run(scenario())
