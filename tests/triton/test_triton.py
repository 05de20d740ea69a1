"""The registration layer against a real Triton server, over gRPC and HTTP."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor

import tritonshm
from tritonshm import triton
from tritonshm._dtypes import NUMPY_TO_TRITON
from triton_fixtures import NUMERIC_IDENTITY_MODELS, make_client, sample

PAGE = 4096

def requested(module, name):
    if module.__name__.endswith("http"):
        return module.InferRequestedOutput(name, binary_data=True)
    return module.InferRequestedOutput(name)


@pytest.fixture
def region():
    with tritonshm.SystemRegion.create(4 * PAGE) as r:
        yield r


@pytest.mark.parametrize("model", sorted(NUMERIC_IDENTITY_MODELS))
def test_every_numeric_dtype_round_trips_through_system_shm(triton_client, region, model):
    module, client = triton_client
    dtype = np.dtype(NUMERIC_IDENTITY_MODELS[model])
    data = sample(dtype, 37)
    name = tritonshm.register(client, region)
    try:
        # Input at a non-zero offset, output on another page at an odd offset.
        in_off, out_off = 24, PAGE + 8
        region.write(data, in_off)
        infer_input = module.InferInput("INPUT0", [data.size], NUMPY_TO_TRITON[dtype])
        tritonshm.bind_input(infer_input, region, in_off)
        out = requested(module, "OUTPUT0")
        tritonshm.bind_output(out, region, out_off, data.nbytes)
        client.infer(model, [infer_input], outputs=[out])
        assert np.array_equal(region.read(dtype, data.size, out_off), data)
    finally:
        tritonshm.unregister(client, name)


def test_bytes_round_trip_through_system_shm(triton_client, region):
    module, client = triton_client
    data = np.array([b"tritonshm", b"", b"\x00\xffbinary", "unicode \u00e9".encode()], dtype=object)
    serialized = serialize_byte_tensor(data).item()  # one bytes object: 4-byte lengths + data
    name = tritonshm.register(client, region)
    try:
        region.write(serialized, 0)
        infer_input = module.InferInput("INPUT0", [data.size], "BYTES")
        with pytest.raises(tritonshm.ShapeMismatch, match="give nbytes"):
            tritonshm.bind_input(infer_input, region, 0)  # BYTES has no implied size
        tritonshm.bind_input(infer_input, region, 0, len(serialized))
        out = requested(module, "OUTPUT0")
        tritonshm.bind_output(out, region, PAGE, PAGE)
        client.infer("identity_bytes", [infer_input], outputs=[out])
        result = deserialize_bytes_tensor(region.read(np.uint8, len(serialized), PAGE).tobytes())
        assert list(result) == list(data)
    finally:
        tritonshm.unregister(client, name)


def test_two_inputs_and_two_outputs_in_one_region(triton_client, region):
    module, client = triton_client
    a, b = sample(np.float32, 16, 1), sample(np.float32, 16, 2)
    name = tritonshm.register(client, region)
    try:
        region.write(a, 0)
        region.write(b, 64)
        inputs = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
        tritonshm.bind_input(inputs[0], region, 0)
        tritonshm.bind_input(inputs[1], region, 64)
        outputs = [requested(module, "OUTPUT0"), requested(module, "OUTPUT1")]
        tritonshm.bind_output(outputs[0], region, PAGE, 64)
        tritonshm.bind_output(outputs[1], region, PAGE + 64, 64)
        client.infer("add_sub", inputs, outputs=outputs)
        assert np.array_equal(region.read(np.float32, 16, PAGE), a + b)
        assert np.array_equal(region.read(np.float32, 16, PAGE + 64), a - b)
    finally:
        tritonshm.unregister(client, name)


def test_undersized_output_region_gives_a_clear_error(triton_client, region):
    module, client = triton_client
    name = tritonshm.register(client, region)
    try:
        region.write(np.ones(4, np.float32), 0)
        infer_input = module.InferInput("INPUT0", [4], "FP32")
        tritonshm.bind_input(infer_input, region, 0)
        out = requested(module, "OUTPUT0")
        tritonshm.bind_output(out, region, PAGE, 8)  # the result needs 16
        with pytest.raises(InferenceServerException) as raw:
            client.infer("identity_fp32", [infer_input], outputs=[out])
        err = tritonshm.errors.translate_error(raw.value, "inferring")
        assert isinstance(err, tritonshm.OutputTooSmall)
        assert (err.output, err.needed) == ("OUTPUT0", 16)
        assert "needs 16 bytes" in str(err)
    finally:
        tritonshm.unregister(client, name)


def test_bindings_are_checked_before_anything_is_sent(triton_client, region):
    module, client = triton_client
    infer_input = module.InferInput("INPUT0", [4], "FP32")
    with pytest.raises(tritonshm.RegistrationError, match="not registered"):
        tritonshm.bind_input(infer_input, region, 0)
    name = tritonshm.register(client, region)
    try:
        for offset in (-1, region.nbytes - 15, region.nbytes + 1, 2**64, 2**63):
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_input(infer_input, region, offset)
        with pytest.raises(tritonshm.ShapeMismatch, match="16 bytes"):
            tritonshm.bind_input(infer_input, region, 0, nbytes=12)
        out = requested(module, "OUTPUT0")
        with pytest.raises(tritonshm.OutOfBounds):
            tritonshm.bind_output(out, region, region.nbytes - 4, 8)
        with pytest.raises(tritonshm.OutOfBounds):
            tritonshm.bind_output(out, region, 2**63, 2**63)
    finally:
        tritonshm.unregister(client, name)
    region.close()
    with pytest.raises(tritonshm.RegionClosed):
        tritonshm.bind_input(infer_input, region, 0)
    with pytest.raises(tritonshm.RegionClosed):
        tritonshm.register(client, region)


def test_register_twice_and_unregister_idempotent(triton_client, region):
    _, client = triton_client
    name = tritonshm.register(client, region)
    assert name == region.key.lstrip("/")
    assert tritonshm.status(client)[name] == {"key": region.key, "offset": 0, "byte_size": region.nbytes}
    with pytest.raises(tritonshm.RegistrationError, match="already has a region"):
        tritonshm.register(client, region)
    tritonshm.unregister(client, name)
    tritonshm.unregister(client, name)  # idempotent
    tritonshm.unregister(client, region)
    assert name not in tritonshm.status(client)


def test_infer_after_unregister_gives_a_clear_error(triton_client, region):
    module, client = triton_client
    name = tritonshm.register(client, region)
    infer_input = module.InferInput("INPUT0", [4], "FP32")
    tritonshm.bind_input(infer_input, region, 0)
    tritonshm.unregister(client, name)
    with pytest.raises(InferenceServerException) as raw:
        client.infer("identity_fp32", [infer_input])
    err = tritonshm.errors.translate_error(raw.value, "inferring")
    assert isinstance(err, tritonshm.RegionNotRegistered)
    assert "register it again" in str(err)
    with pytest.raises(tritonshm.RegionNotRegistered):
        tritonshm.status(client, name)


def test_unregister_never_touches_other_clients_regions(server, protocol):
    _, mine = make_client(server, protocol)
    _, theirs = make_client(server, protocol)
    with tritonshm.SystemRegion.create(PAGE) as a, tritonshm.SystemRegion.create(PAGE) as b:
        ours = tritonshm.register(mine, a)
        # A region registered by someone else entirely, with raw tritonclient.
        theirs.register_system_shared_memory("someone-elses-region", b.key, b.nbytes)
        try:
            with pytest.raises(tritonshm.RegistrationError, match="not registered by this process"):
                tritonshm.unregister(mine, "someone-elses-region")
            with pytest.raises(tritonshm.RegistrationError, match="without a name"):
                tritonshm.unregister(mine, "")
            tritonshm.unregister(mine, ours)
            regions = tritonshm.status(theirs)
            assert "someone-elses-region" in regions and ours not in regions
        finally:
            theirs.unregister_system_shared_memory("someone-elses-region")
    mine.close()
    theirs.close()


def test_server_that_cannot_open_our_memory(triton_client):
    _, client = triton_client
    with tritonshm.SystemRegion.create(PAGE) as owner:
        attached = tritonshm.SystemRegion.attach(owner.key)
    # The name is gone (its owner closed), so the server cannot shm_open it,
    # exactly as when it runs on another machine or IPC namespace.
    with attached:
        with pytest.raises(tritonshm.SharedMemoryRefused, match="--ipc=host"):
            tritonshm.register(client, attached)


def test_dead_server_is_reported_as_unavailable(protocol):
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient("127.0.0.1:1")
    with tritonshm.SystemRegion.create(PAGE) as r:
        with pytest.raises(tritonshm.ServerUnavailable):
            tritonshm.register(client, r)


def test_registrations_are_gone_after_a_server_restart(fresh_server, protocol):
    _, client = make_client(fresh_server, protocol)
    with tritonshm.SystemRegion.create(PAGE) as r:
        name = tritonshm.register(client, r)
        fresh_server.restart()
        _, client = make_client(fresh_server, protocol)
        with pytest.raises(tritonshm.RegionNotRegistered, match="restarted"):
            tritonshm.status(client, name)
        assert tritonshm.register(client, r) == name  # and can be registered again
        tritonshm.unregister(client, name)
    client.close()


async def _aio_round_trip(srv):
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(srv.grpc_url)
    with tritonshm.SystemRegion.create(PAGE) as r:
        name = await tritonshm.register(client, r)
        assert name in await tritonshm.status(client)
        await tritonshm.unregister(client, name)
        assert name not in await tritonshm.status(client)
    await client.close()


def test_aio_clients_get_awaitables(server):
    import asyncio

    asyncio.run(_aio_round_trip(server))


def test_bind_at_the_very_end_and_unregister_of_nonsense_are_refused(triton_client, region):
    module, client = triton_client
    name = tritonshm.register(client, region)
    try:
        # Triton refuses offset == size even for zero bytes: say so before sending.
        with pytest.raises(tritonshm.OutOfBounds, match="no room"):
            tritonshm.bind_output(module.InferRequestedOutput("OUTPUT0"), region, offset=region.nbytes)
        with pytest.raises(tritonshm.OutOfBounds, match="no room"):
            tritonshm.bind_input(module.InferInput("INPUT0", [0], "FP32"), region, offset=region.nbytes)
        for nonsense in (None, 3, object()):
            with pytest.raises(tritonshm.RegistrationError, match="registered name or region"):
                tritonshm.unregister(client, nonsense)
    finally:
        tritonshm.unregister(client, name)


def test_unregister_waits_for_a_request_still_using_the_region(triton_client, region, server):
    """Triton 2.51 refuses to unregister a region an inference is using ("currently in use"):
    unregister() asks again until the request is over (here slow_fp32's 500 ms) instead of
    failing, and the request's output is intact."""
    import concurrent.futures
    import threading
    import time

    import tritonclient.grpc as grpcclient

    module, client = triton_client
    data = sample(np.float32, 64)
    name = tritonshm.register(client, region)
    region.write(data, 0)
    sending = threading.Event()

    def slow_request():  # its own gRPC client, in its own thread
        other = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            infer_input = grpcclient.InferInput("INPUT0", [data.size], "FP32")
            tritonshm.bind_input(infer_input, region, 0, name=name)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            tritonshm.bind_output(out, region, PAGE, data.nbytes, name=name)
            sending.set()
            other.infer("slow_fp32", [infer_input], outputs=[out])
        finally:
            other.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(slow_request)
        sending.wait()
        time.sleep(0.2)  # the request reaches the server in milliseconds; the model takes 500 ms
        tritonshm.unregister(client, name)  # refused while slow_fp32 runs, then done
        running.result()
    assert name not in tritonshm.status(client)
    assert np.array_equal(region.read(np.float32, data.size, PAGE), data)
