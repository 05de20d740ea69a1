"""CUDA regions with a real Triton server, on any machine: the server opens FAKE handles.

The fake CUDA runtime (tests/fake_cudart) is both tritonshm's runtime here
and ``LD_PRELOAD``-ed into a real tritonserver 2.51, so the server's
``cudaIpcOpenMemHandle`` maps our fake device memory: registration over
gRPC and HTTP (base64 handles), ``status(kind="cuda")``, unregistering by
name with the right extension, and inference through CUDA shared memory
all run against the real server.  The session's plain server (no fake, no
GPU) stands in for a server that cannot open our handles.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tritonshm

from triton_fixtures import make_client, sample


@pytest.fixture
def fake_client(fake_cuda_server, protocol, fake_cuda):
    module, client = make_client(fake_cuda_server, protocol)
    yield module, client
    client.close()


def test_register_infer_status_unregister(fake_client):
    module, client = fake_client
    data = sample(np.float32, 64)
    with tritonshm.CudaRegion.create(1 << 16) as c:
        name = tritonshm.register(client, c)
        assert name == c.key
        try:
            assert tritonshm.status(client, kind="cuda")[name] == {"device_id": 0, "byte_size": 1 << 16}
            assert name not in tritonshm.status(client)  # not a system region
            c.write(data, offset=4096)
            inp = module.InferInput("INPUT0", [64], "FP32")
            tritonshm.bind_input(inp, c, offset=4096)
            out = module.InferRequestedOutput("OUTPUT0")
            tritonshm.bind_output(out, c, offset=8192, nbytes=data.nbytes)
            client.infer("identity_fp32", [inp], outputs=[out])
            np.testing.assert_array_equal(c.read(np.float32, 64, offset=8192), data)
        finally:
            tritonshm.unregister(client, name)  # by name: the CUDA extension, as registered
        assert name not in tritonshm.status(client, kind="cuda")


def test_unregister_by_region_and_idempotent(fake_client):
    _, client = fake_client
    with tritonshm.CudaRegion.create(4096) as c:
        name = tritonshm.register(client, c, name="my-cuda-region")
        assert name == "my-cuda-region"
        tritonshm.unregister(client, c)
        tritonshm.unregister(client, c)
        assert name not in tritonshm.status(client, kind="cuda")
        with pytest.raises(tritonshm.RegionNotRegistered):
            tritonshm.status(client, name, kind="cuda")


def test_device_id_is_the_servers_numbering(fake_client):
    _, client = fake_client
    with tritonshm.CudaRegion.create(4096) as c:
        with pytest.raises(tritonshm.RegistrationError, match="device_id"):
            tritonshm.register(client, c, device_id=-1)
        name = tritonshm.register(client, c, device_id=0)
        assert tritonshm.status(client, name, kind="cuda")[name]["device_id"] == 0
        tritonshm.unregister(client, name)
    with tritonshm.SystemRegion.create(4096) as s:
        with pytest.raises(tritonshm.RegistrationError, match="CUDA regions only"):
            tritonshm.register(client, s, device_id=0)


def test_binds_are_checked_before_sending(fake_client):
    module, client = fake_client
    with tritonshm.CudaRegion.create(4096) as c:
        name = tritonshm.register(client, c)
        try:
            inp = module.InferInput("INPUT0", [1024], "FP32")
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_input(inp, c, offset=4)
            out = module.InferRequestedOutput("OUTPUT0")
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_output(out, c, offset=4000, nbytes=200)
        finally:
            tritonshm.unregister(client, name)
        c.close()
        with pytest.raises(tritonshm.RegionClosed):
            tritonshm.register(client, c)
        with pytest.raises(tritonshm.RegionClosed):
            tritonshm.bind_input(module.InferInput("INPUT0", [4], "FP32"), c)


def test_aio_clients_register_cuda_regions(fake_cuda_server, protocol, fake_cuda):
    if protocol == "grpc":
        import tritonclient.grpc.aio as aio

        url = fake_cuda_server.grpc_url
    else:
        import tritonclient.http.aio as aio

        url = fake_cuda_server.http_url

    async def main():
        client = aio.InferenceServerClient(url)
        try:
            with tritonshm.CudaRegion.create(4096) as c:
                name = await tritonshm.register(client, c)
                regions = await tritonshm.status(client, kind="cuda")
                assert regions[name]["byte_size"] == 4096
                await tritonshm.unregister(client, name)
                assert name not in await tritonshm.status(client, kind="cuda")
        finally:
            await client.close()

    asyncio.run(main())


def test_server_that_cannot_open_our_handles(triton_client, fake_cuda):
    """The plain CPU server (no fake, no GPU) refuses: SharedMemoryRefused names the causes."""
    _, client = triton_client
    with tritonshm.CudaRegion.create(4096) as c:
        with pytest.raises(tritonshm.SharedMemoryRefused, match="ipc=host") as info:
            tritonshm.register(client, c)
        assert "same process" in str(info.value) and "CPU-only" in str(info.value)
        assert tritonshm.triton.registered_name(c) is None
