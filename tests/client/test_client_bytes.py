"""BYTES tensors through the Client's shared memory, gRPC and HTTP, blocking and aio."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tritonshm
from tritonshm.client._slots import SYSTEM, SlotKind  # noqa: F401 (the private pool keys)
import tritonshm.aio
from tritonshm import _tritonclient_compat as compat
from triton_fixtures import client_url
from support.insides import live_pool

STRINGS = [b"", b"a", "\u00e9t\u00e9 \u2603".encode(), b"\x00\xff" * 50, b"", "\U0001f600".encode()]


def as_objects(items, shape=None):
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape or (len(items),))


def bound_to_shared_memory(client, model):
    """Whether every cached input and output of the model's pool names a shared-memory region."""
    pool = live_pool(client, model)
    # Per slot, by name: inputs as (InferInput, shape, nbytes), outputs as they are (and, by a
    # tuple key, prepared gRPC messages, left out here).
    objects = [obj[0] if isinstance(obj, tuple) else obj
               for extent in pool.extents for cache in extent.requests.values()
               for key, obj in cache.items() if isinstance(key, str)]
    return bool(objects) and all("shared_memory_region" in str(compat.tensor_of(obj)) for obj in objects)


@pytest.fixture
def client(server, protocol):
    with tritonshm.Client(client_url(server, protocol)) as c:
        yield c


def test_bytes_travel_in_shared_memory(client):
    data = as_objects(STRINGS)
    out = client.infer("identity_bytes", {"INPUT0": data})
    assert out["OUTPUT0"].dtype == object and list(out["OUTPUT0"]) == STRINGS
    assert bound_to_shared_memory(client, "identity_bytes")


def test_str_inputs_are_sent_as_utf8(client):
    out = client.infer("identity_bytes", {"INPUT0": np.array(["caf\u00e9", "", "\u4e2d\u6587"], dtype=object)})
    assert list(out["OUTPUT0"]) == ["caf\u00e9".encode(), b"", "\u4e2d\u6587".encode()]


def test_large_elements_grow_the_slot(client):
    small = as_objects([b"x" * 10])
    assert list(client.infer("identity_bytes", {"INPUT0": small})["OUTPUT0"]) == [b"x" * 10]
    big = as_objects([bytes(range(256)) * 8192, b"", b"tail"])  # 2 MiB element
    assert list(client.infer("identity_bytes", {"INPUT0": big})["OUTPUT0"]) == list(big)
    assert bound_to_shared_memory(client, "identity_bytes")


def test_bytes_mixed_with_numbers_batched_and_chunked(client):
    batch = 20  # max_batch_size 8: three chunks
    strings = as_objects([f"item {i} \u00e9".encode() * (i % 4) for i in range(batch * 3)], (batch, 3))
    numbers = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
    out = client.infer("mixed_bytes", {"INPUT0": strings, "INPUT1": numbers})
    assert out["OUTPUT0"].shape == (batch, 3) and out["OUTPUT0"].tolist() == strings.tolist()
    assert np.array_equal(out["OUTPUT1"], numbers)
    assert bound_to_shared_memory(client, "mixed_bytes")


def test_empty_tensors(client):
    """Triton refuses 0-byte shared-memory bindings: empty tensors still work."""
    out = client.infer("identity_bytes", {"INPUT0": as_objects([])})
    assert out["OUTPUT0"].shape == (0,)
    out = client.infer("identity_fp32", {"INPUT0": np.empty(0, np.float32)})
    assert out["OUTPUT0"].shape == (0,) and out["OUTPUT0"].dtype == np.float32


def test_bytes_refuses_numbers_before_sending(client):
    with pytest.raises(tritonshm.DTypeMismatch, match="BYTES"):
        client.infer("identity_bytes", {"INPUT0": np.arange(3, dtype=np.float32)})
    with pytest.raises(tritonshm.DTypeMismatch):
        client.infer("identity_bytes", {"INPUT0": as_objects([b"ok", 3])})


def test_aio_bytes_in_shared_memory(server, protocol):
    async def scenario():
        async with tritonshm.aio.Client(client_url(server, protocol)) as c:
            data = as_objects(STRINGS)
            out = await c.infer("identity_bytes", {"INPUT0": data})
            assert list(out["OUTPUT0"]) == STRINGS
            mixed = await c.infer("mixed_bytes", {"INPUT0": as_objects([b"a", b"bc"], (1, 2)),
                                                  "INPUT1": np.ones((1, 2), np.float32)})
            assert mixed["OUTPUT0"].tolist() == [[b"a", b"bc"]]
            assert bound_to_shared_memory(c, "identity_bytes")

    asyncio.run(scenario())
