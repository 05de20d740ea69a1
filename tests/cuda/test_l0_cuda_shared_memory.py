"""Triton's own CUDA shared-memory acceptance test, ported onto tritonshm's API.

This is a port of ``qa/L0_cuda_shared_memory/cuda_shared_memory_test.py`` (and of how its
``test.sh`` runs it) from the Triton Inference Server repository, tag v2.51.0
(https://github.com/triton-inference-server/server).  The original carries this notice:

    Copyright 2019-2024, NVIDIA CORPORATION & AFFILIATES. All rights reserved.

    Redistribution and use in source and binary forms, with or without
    modification, are permitted provided that the following conditions
    are met:
     * Redistributions of source code must retain the above copyright
       notice, this list of conditions and the following disclaimer.
     * Redistributions in binary form must reproduce the above copyright
       notice, this list of conditions and the following disclaimer in the
       documentation and/or other materials provided with the distribution.
     * Neither the name of NVIDIA CORPORATION nor the names of its
       contributors may be used to endorse or promote products derived
       from this software without specific prior written permission.

    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS ``AS IS'' AND ANY
    EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
    IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
    PURPOSE ARE DISCLAIMED.  IN NO EVENT SHALL THE COPYRIGHT OWNER OR
    CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
    EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
    PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
    PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY
    OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
    (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
    OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

What changed in the port, and why:

* ``tritonclient.utils.cuda_shared_memory`` became :class:`tritonshm.CudaRegion`, the raw
  ``register_cuda_shared_memory`` / ``set_shared_memory`` calls became ``tritonshm.register`` /
  ``bind_input`` / ``bind_output``, the status calls ``tritonshm.status(kind="cuda")``.
* Every case runs over gRPC and HTTP (``test.sh`` ran each with ``CLIENT_TYPE`` set to each).
* The original ran one fresh server per case and counted *all* of the server's regions; here a
  session server is shared, so the regions get per-test names (``input0_data-<token>``) and the
  counts are of this test's names, and every test unregisters and frees what it made.
* Where the server used to be the one to refuse something that tritonshm now refuses before
  sending (out-of-bound offsets and sizes, a byte size that does not match the input, a closed
  region, unregistering "all"), the test asserts tritonshm's error and then, where it is cheap,
  goes around tritonshm with raw tritonclient calls to show the server refuses it too.
* ``test_unregisterall``: tritonshm never unregisters "all" (it would remove other clients'
  regions); the port checks that it refuses and that each region goes by name.
* ``test_mixed_raw_shm``: the original's helper tested ``type(x) == np.array`` (always False), so
  it never actually sent INPUT1 raw; the port does mix a raw INPUT1 with CUDA shared memory.
* ``TestCudaSharedMemoryUnregister``: its delayed model (``qa/python_models/execute_delayed_model``,
  15 s) becomes the bundled ``simple`` model wrapped with a shorter sleep, in a server of this
  module's own.
* The model: Triton's ``simple`` example is TensorFlow; tritonshm bundles a Python-backend
  stand-in with the same config (INT32 [16], max_batch_size 8, OUTPUT0 = sum, OUTPUT1 = difference).

Everything here needs a real CUDA GPU and a GPU-capable server (skips otherwise).
"""

from __future__ import annotations

import atexit
import base64
import secrets
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

import tritonshm
from tritonshm.server import LocalServer, bundled_model_repository

from triton_fixtures import make_client, start_or_skip

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]

#: The original's DEFAULT_SHM_BYTE_SIZE: 16 INT32 values.
SHM_BYTES = 64
MODEL = "simple"
INPUT0 = np.arange(start=0, stop=16, dtype=np.int32)
INPUT1 = np.ones(shape=16, dtype=np.int32)
#: The four regions of the original's _configure_server, in its order.
BASES = ("input0_data", "input1_data", "output0_data", "output1_data")

#: How long the delayed model sleeps (the original's was 15 s) and when the test looks.
DELAY_S = 6
LOOK_AFTER_S = 2


def is_http(module) -> bool:
    return module.__name__.endswith("http")


def requested(module, name, binary_data=True):
    if is_http(module):
        return module.InferRequestedOutput(name, binary_data=binary_data)
    return module.InferRequestedOutput(name)


def raw_handle(region) -> str:
    """The handle as tritonclient takes it (base64, for both protocols)."""
    return base64.b64encode(region.ipc_handle).decode("ascii")


#: Regions the session's server maps although no registration names them (a registration it
#: refused after opening the handle: Triton 2.51 keeps it open): never freed while it runs.
MAPPED_BY_THE_SERVER: list = []
# Closed at exit, after pytest's session (and its server) has ended.
atexit.register(lambda: [region.close() for region in MAPPED_BY_THE_SERVER])


class Shm:
    """The regions one test makes on one server, named ``<base>-<token>``; gone at the end."""

    def __init__(self, client):
        self.client = client
        self.token = secrets.token_hex(4)
        self.regions: list[tritonshm.CudaRegion] = []

    def name(self, base: str) -> str:
        return f"{base}-{self.token}"

    def create(self, nbytes: int = SHM_BYTES) -> tritonshm.CudaRegion:
        region = tritonshm.CudaRegion.create(nbytes, device=0)
        self.regions.append(region)
        return region

    def register(self, region, base: str) -> str:
        name = tritonshm.register(self.client, region, self.name(base))
        assert name == self.name(base)
        return name

    def configure(self, create_byte_size: int = SHM_BYTES) -> dict[str, tritonshm.CudaRegion]:
        """The original's _configure_server: four regions, the inputs written, all registered."""
        regions = {base: self.create(create_byte_size) for base in BASES}
        assert regions["input0_data"].write(INPUT0) == INPUT0.nbytes
        assert regions["input1_data"].write(INPUT1) == INPUT1.nbytes
        for base, region in regions.items():
            self.register(region, base)
        return regions

    def ours(self, client=None) -> dict[str, dict]:
        """The server's CUDA regions of this test, by name."""
        regions = tritonshm.status(client or self.client, kind="cuda")
        return {name: entry for name, entry in regions.items() if name.endswith("-" + self.token)}

    def names(self, *bases: str) -> set[str]:
        return {self.name(base) for base in bases}

    def cleanup(self) -> None:
        for region in self.regions:
            try:
                tritonshm.unregister(self.client, region)  # no-op if never registered
            except tritonshm.Error:
                pass
            region.close()


@pytest.fixture
def shm(triton_client):
    _, client = triton_client
    made = Shm(client)
    yield made
    made.cleanup()


def make_request(module, regions, *, input1=None):
    """The original's shm_basic_infer up to the send, on tritonshm's bindings.

    *input1* is a region to read INPUT1 from (default: input1_data) or an array to send raw.
    """
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    outputs = [requested(module, "OUTPUT0", True), requested(module, "OUTPUT1", False)]
    tritonshm.bind_input(inputs[0], regions["input0_data"])
    if isinstance(input1, np.ndarray):
        if is_http(module):
            inputs[1].set_data_from_numpy(input1.reshape(1, 16), binary_data=True)
        else:
            inputs[1].set_data_from_numpy(input1.reshape(1, 16))
    else:
        tritonshm.bind_input(inputs[1], regions["input1_data"] if input1 is None else input1)
    tritonshm.bind_output(outputs[0], regions["output0_data"])
    tritonshm.bind_output(outputs[1], regions["output1_data"])
    return inputs, outputs


def check_result(module, result, regions, input1=INPUT1):
    """The outputs' metadata in the reply, their values in the CUDA regions."""
    output = result.get_output("OUTPUT0")
    if is_http(module):
        datatype, shape = output["datatype"], list(output["shape"])
    else:
        datatype, shape = output.datatype, list(output.shape)
    assert (datatype, shape) == ("INT32", [1, 16])
    np.testing.assert_array_equal(regions["output0_data"].read(np.int32, (1, 16))[0], INPUT0 + input1)
    np.testing.assert_array_equal(regions["output1_data"].read(np.int32, (1, 16))[0], INPUT0 - input1)


def shm_basic_infer(module, client, regions, input1=None):
    """The original's shm_basic_infer: send, then check what came back in the regions."""
    inputs, outputs = make_request(module, regions, input1=input1)
    result = client.infer(MODEL, inputs, model_version="", outputs=outputs)
    check_result(module, result, regions, INPUT1 if input1 is None else input1)
    return result


def raw_refusal(client, inputs, outputs) -> str:
    """Send a request tritonshm would not have sent; the server's error message."""
    with pytest.raises(InferenceServerException) as raw:
        client.infer(MODEL, inputs, model_version="", outputs=outputs)
    return str(raw.value)


# --------------------------------------------------------------------------
# CudaSharedMemoryTest
# --------------------------------------------------------------------------


def test_invalid_create_shm(protocol):
    # The original: create_shared_memory_region("dummy_data", -1, 0) raises
    # "unable to create cuda shared memory handle".  tritonshm says why, before any CUDA call.
    for nbytes in (-1, 0):
        with pytest.raises(tritonshm.OutOfBounds, match="positive size") as err:
            tritonshm.CudaRegion.create(nbytes, device=0)
        assert isinstance(err.value, ValueError)
    with pytest.raises(tritonshm.OutOfBounds, match="larger than any allocation"):
        tritonshm.CudaRegion.create(2**63, device=0)
    with pytest.raises(tritonshm.OutOfBounds):
        tritonshm.CudaRegion.create(8, device=-1)


def test_valid_create_set_register(triton_client, shm):
    _, client = triton_client
    region = shm.create(8)
    assert region.write(np.array([1, 2], dtype=np.float32)) == 8
    name = shm.register(region, "dummy_data")
    assert shm.ours() == {name: {"device_id": 0, "byte_size": 8}}
    assert tritonshm.status(client, name, kind="cuda") == {name: {"device_id": 0, "byte_size": 8}}
    np.testing.assert_array_equal(region.read(np.float32, 2), [1, 2])
    np.testing.assert_array_equal(region.view(np.float32, (2,)).get(), [1, 2])


def test_unregister_before_register(triton_client, shm):
    _, client = triton_client
    region = shm.create(8)
    # By region: it was never registered, so there is nothing to do.
    assert tritonshm.unregister(client, region) is None
    # By name: tritonshm refuses a name it did not register (it may be someone else's) ...
    with pytest.raises(tritonshm.RegistrationError, match="not registered by this process"):
        tritonshm.unregister(client, shm.name("dummy_data"))
    # ... where the server itself (the original's call) accepts it and does nothing.
    client.unregister_cuda_shared_memory(shm.name("dummy_data"))
    assert shm.ours() == {}


def test_unregister_after_register(triton_client, shm):
    _, client = triton_client
    region = shm.create(8)
    name = shm.register(region, "dummy_data")
    assert set(shm.ours()) == {name}
    tritonshm.unregister(client, name)
    assert shm.ours() == {}
    tritonshm.unregister(client, name)  # idempotent
    tritonshm.unregister(client, region)
    assert shm.ours() == {}
    with pytest.raises(tritonshm.RegionNotRegistered, match="Unable to find cuda shared memory region"):
        tritonshm.status(client, name, kind="cuda")


def test_reregister_after_register(triton_client, shm):
    _, client = triton_client
    region = shm.create(8)
    name = shm.register(region, "dummy_data")
    with pytest.raises(tritonshm.RegistrationError, match="already has a region") as err:
        tritonshm.register(client, region, name)
    assert not isinstance(err.value, tritonshm.SharedMemoryRefused)
    assert f"shared memory region '{name}' already in manager" in str(err.value)
    # The server's own words, without tritonshm (the original's call).
    with pytest.raises(InferenceServerException, match=f"shared memory region '{name}' already in manager"):
        client.register_cuda_shared_memory(name, raw_handle(region), 0, 8)
    assert shm.ours() == {name: {"device_id": 0, "byte_size": 8}}


def test_unregister_after_inference(triton_client, shm):
    module, client = triton_client
    regions = shm.configure()
    shm_basic_infer(module, client, regions)
    tritonshm.unregister(client, shm.name("output0_data"))
    assert set(shm.ours()) == shm.names("input0_data", "input1_data", "output1_data")


def test_register_after_inference(triton_client, shm):
    module, client = triton_client
    regions = shm.configure()
    shm_basic_infer(module, client, regions)
    shm.register(shm.create(64), "input2_data")
    assert set(shm.ours()) == shm.names(*BASES, "input2_data")
    # The registrations in place still serve requests.
    regions["output0_data"].write(np.zeros(16, np.int32))
    regions["output1_data"].write(np.zeros(16, np.int32))
    shm_basic_infer(module, client, regions)


def test_too_big_shm(triton_client, shm):
    # An input bound with more bytes than the tensor has: the server refuses ("input byte size
    # mismatch"); tritonshm computes the size from the input's shape and refuses before sending.
    module, client = triton_client
    regions = shm.configure()
    big = shm.create(128)
    big_name = shm.register(big, "input2_data")
    assert big.write(INPUT1) == 64
    inputs, outputs = make_request(module, regions)
    with pytest.raises(tritonshm.ShapeMismatch, match="64 bytes, not nbytes=128"):
        tritonshm.bind_input(inputs[1], big, nbytes=128)
    # A region larger than the tensor is fine when the binding is the tensor's size.
    tritonshm.bind_input(inputs[1], big)
    check_result(module, client.infer(MODEL, inputs, model_version="", outputs=outputs), regions)
    # Around tritonshm: the original's request, and the server's refusal.
    inputs[1].set_shared_memory(big_name, 128)
    message = raw_refusal(client, inputs, outputs)
    assert f"input byte size mismatch for input 'INPUT1' for model '{MODEL}'. Expected 64, got 128" in message


def test_mixed_raw_shm(triton_client, shm):
    # INPUT0 from CUDA shared memory, INPUT1 in the request itself, outputs to CUDA shared memory.
    module, client = triton_client
    regions = shm.configure()
    input1 = np.full(16, 5, dtype=np.int32)
    shm_basic_infer(module, client, regions, input1=input1)


def test_unregisterall(triton_client, shm):
    # The original: unregister_cuda_shared_memory() with no name removes every region of the
    # server, other clients' too.  tritonshm has no such call and refuses to be tricked into one.
    _, client = triton_client
    regions = shm.configure()
    assert set(shm.ours()) == shm.names(*BASES)
    with pytest.raises(tritonshm.RegistrationError, match="without a name"):
        tritonshm.unregister(client, "")
    assert set(shm.ours()) == shm.names(*BASES)
    # One by one, by name or by region.
    tritonshm.unregister(client, shm.name("input0_data"))
    tritonshm.unregister(client, regions["input1_data"])
    assert set(shm.ours()) == shm.names("output0_data", "output1_data")
    tritonshm.unregister(client, shm.name("output0_data"))
    tritonshm.unregister(client, regions["output1_data"])
    assert shm.ours() == {}


def test_register_out_of_bound(triton_client, shm):
    # tritonshm registers whole regions: byte_size is always the allocation's size.
    _, client = triton_client
    region = shm.create(SHM_BYTES)
    name = shm.register(region, "input0_data")
    assert shm.ours() == {name: {"device_id": 0, "byte_size": SHM_BYTES}}
    # Around tritonshm, with another allocation (the server keeps a handle it opened for a
    # refused registration open): one byte more than the allocation, refused by the server.
    other = tritonshm.CudaRegion.create(SHM_BYTES, device=0)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region.*invalid args"):
        client.register_cuda_shared_memory(shm.name("input1_data"), raw_handle(other), 0, SHM_BYTES + 1)
    assert set(shm.ours()) == {name}
    # The server maps `other` until it exits: freed, its address would be poisoned there -- the
    # next allocation at it refused ("invalid args"), as seen on an H200 when later tests of the
    # session failed to register.  So it is kept, as long as the session's server runs.
    MAPPED_BY_THE_SERVER.append(other)


def test_infer_offset_out_of_bound(triton_client, shm, protocol):
    # An output offset outside the region: "Invalid offset for shared memory region".
    module, client = triton_client
    regions = shm.configure()
    # The original's offsets: for HTTP -32 as a uint64 (a negative offset by overflow); gRPC
    # refuses values above 2**63 - 1 itself, so one byte past the 64-byte region there.
    offset = 2**64 - 32 if protocol == "http" else 64
    out = requested(module, "OUTPUT0")
    for bad in (2**64 - 32, 64, 65, 2**63, -32):
        with pytest.raises(tritonshm.OutOfBounds):
            tritonshm.bind_output(out, regions["output0_data"], bad, SHM_BYTES)
        if bad != 64:  # (at offset 64, "the rest of the region" is 0 bytes)
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_output(out, regions["output0_data"], bad)
    # Around tritonshm: the original's request, and the server's refusal.
    inputs, outputs = make_request(module, regions)
    outputs[0].set_shared_memory(shm.name("output0_data"), SHM_BYTES, offset=offset)
    outputs[1].set_shared_memory(shm.name("output1_data"), SHM_BYTES, offset=offset)
    assert "Invalid offset for shared memory region" in raw_refusal(client, inputs, outputs)


def test_infer_byte_size_out_of_bound(triton_client, shm):
    # offset 60 + 64 bytes in a 64-byte region: "Invalid offset + byte size for shared memory region".
    module, client = triton_client
    regions = shm.configure()
    offset, byte_size = 60, SHM_BYTES
    for region in (regions["output0_data"], regions["output1_data"]):
        with pytest.raises(tritonshm.OutOfBounds):
            tritonshm.bind_output(requested(module, "OUTPUT0"), region, offset, byte_size)
    with pytest.raises(tritonshm.OutOfBounds):
        tritonshm.bind_input(module.InferInput("INPUT0", [1, 16], "INT32"), regions["input0_data"], 4)
    # Around tritonshm: the original's request, and the server's refusal.
    inputs, outputs = make_request(module, regions)
    outputs[0].set_shared_memory(shm.name("output0_data"), byte_size, offset=offset)
    outputs[1].set_shared_memory(shm.name("output1_data"), byte_size, offset=offset)
    assert "Invalid offset + byte size for shared memory region" in raw_refusal(client, inputs, outputs)


def test_closed_region_is_refused_before_sending(triton_client, shm):
    # Not in the original (its handles could be destroyed while registered): tritonshm refuses to
    # register or bind a closed region, and still unregisters it by region.
    module, client = triton_client
    regions = shm.configure()
    closed = regions["input0_data"]
    closed.close()
    infer_input = module.InferInput("INPUT0", [1, 16], "INT32")
    with pytest.raises(tritonshm.RegionClosed):
        tritonshm.bind_input(infer_input, closed)
    with pytest.raises(tritonshm.RegionClosed):
        tritonshm.bind_output(requested(module, "OUTPUT0"), closed)
    with pytest.raises(tritonshm.RegionClosed):
        tritonshm.register(client, closed, shm.name("input3_data"))
    with pytest.raises(tritonshm.RegionClosed):
        closed.write(INPUT0)
    tritonshm.unregister(client, closed)
    assert set(shm.ours()) == shm.names("input1_data", "output0_data", "output1_data")


# --------------------------------------------------------------------------
# TestCudaSharedMemoryUnregister: unregistering while an inference holds the regions
# --------------------------------------------------------------------------

#: The bundled "simple" model, late by DELAY_S (cf. qa/python_models/execute_delayed_model).
DELAYED_MODEL = '''\
"""The bundled "simple" model, {delay} s late: tests/test_l0_cuda_shared_memory.py's stand-in
for Triton's qa/python_models/execute_delayed_model."""

import sys
import time

sys.path.insert(0, {tritonshm_dir!r})  # the server's environment has no tritonshm: import the file

from _bundled_model import TritonPythonModel as _Bundled  # noqa: E402


class TritonPythonModel(_Bundled):
    def execute(self, requests):
        time.sleep({delay})
        return super().execute(requests)
'''


@pytest.fixture(scope="module")
def delayed_server(tmp_path_factory):
    """A server of this module's own whose ``simple`` model takes DELAY_S per request."""
    repo = tmp_path_factory.mktemp("l0-cuda-shm-models")
    bundled = bundled_model_repository()
    shutil.copytree(bundled / MODEL, repo / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / MODEL / "1" / "model.py").write_text(
        DELAYED_MODEL.format(delay=DELAY_S, tritonshm_dir=str(Path(bundled).parent))
    )
    with start_or_skip(LocalServer(repo)) as srv:
        # As the session server does: the clients' long-lived pollers before any leak check.
        import tritonclient.grpc
        import tritonclient.http

        tritonclient.http.InferenceServerClient(srv.http_url).close()
        warm = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
        warm.is_server_live()
        warm.close()
        yield srv


def _refused_while_in_use(second, shm) -> None:
    """The original's _test_unregister_shm_fail, through tritonshm and around it."""
    # tritonshm never unregisters "all" ...
    with pytest.raises(tritonshm.RegistrationError, match="without a name"):
        tritonshm.unregister(second, "")
    # ... which the server would refuse now anyway, naming each region in use.
    with pytest.raises(InferenceServerException) as raw:
        second.unregister_cuda_shared_memory()
    assert "Failed to unregister the following cuda shared memory regions" in str(raw.value)
    for name in shm.names(*BASES):
        assert name in str(raw.value)
    # One by one: the server's refusal comes back as a ServerError that keeps its words.  Asked
    # without patience: unregister() otherwise asks again for a second per region, and on a fast
    # GPU the delayed request is over before the last one is asked (the refusal no longer seen).
    for name in sorted(shm.names(*BASES)):
        with pytest.raises(tritonshm.ServerError) as err:
            tritonshm.unregister(second, name, patience=0.0)
        assert f"Cannot unregister shared memory region '{name}', it is currently in use." in str(err.value)
    assert set(shm.ours(second)) == shm.names(*BASES)


def test_unregister_shm_during_inference(delayed_server, protocol):
    module, client = make_client(delayed_server, protocol)
    # The original's second client is an HTTP one for both protocols.
    _, second = make_client(delayed_server, "http")
    shm = Shm(client)
    wait = None
    try:
        regions = shm.configure()
        inputs, outputs = make_request(module, regions)
        if is_http(module):
            pending = client.async_infer(model_name=MODEL, inputs=inputs, outputs=outputs)

            def wait():
                return pending.get_result(timeout=DELAY_S + 30)
        else:
            done = threading.Event()
            outcome = []

            def callback(result, error):
                outcome.append(error if error is not None else result)
                done.set()

            client.async_infer(model_name=MODEL, inputs=inputs, callback=callback, outputs=outputs)

            def wait():
                assert done.wait(DELAY_S + 30), "no reply from the delayed model"
                if isinstance(outcome[0], Exception):
                    raise outcome[0]
                return outcome[0]

        time.sleep(LOOK_AFTER_S)  # the request is in the model's sleep by now
        _refused_while_in_use(second, shm)

        result, wait = wait(), None
        check_result(module, result, regions)

        # Done: each region goes by name now, and the server no longer knows any of them.
        for name in sorted(shm.names(*BASES)):
            tritonshm.unregister(client, name)
        for name in sorted(shm.names(*BASES)):
            with pytest.raises(tritonshm.RegionNotRegistered,
                               match=f"Unable to find cuda shared memory region: '{name}'"):
                tritonshm.status(second, name, kind="cuda")
    finally:
        if wait is not None:  # a failure above: let the server finish with our memory first
            try:
                wait()
            except Exception:
                pass
        shm.cleanup()
        client.close()
        second.close()
