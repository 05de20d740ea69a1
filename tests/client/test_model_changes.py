"""A model that changes under the client (issue 39): reloaded with another output datatype, an
output renamed, an input's datatype changed, a new version.  The client checks every answer
against what it planned from the model's metadata -- each output's datatype and shape, the version
that ran -- and reads the model again when its own checks or the server's refusal say that it
changed: the request runs again where that is safe, or fails saying what changed.  Before, the
FP32 bits of a reloaded model's output were read as the INT32 the client had planned.

The server here runs in explicit model-control mode, its own repository holding ``changing`` (the
bundled identity_int32), loaded with a config given by each test (tritonclient's load_model).
"""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import tritonshm
import tritonshm.aio
from tritonshm.server import LocalServer, bundled_model_repository
from fake_cuda import server_env
from triton_fixtures import client_url, start_or_skip

MODEL = "changing"


def config(output: str = "OUTPUT0", output_type: str = "TYPE_INT32", input_type: str = "TYPE_INT32",
           max_batch_size: int = 0, dims: tuple = (-1,), streaming: bool | None = None) -> dict:
    """The model's config.  *streaming* (True or False) gives another model: FP32 INPUT0 and INT32
    COUNT in, OUTPUT0 and INDEX out -- decoupled, COUNT responses (the bundled model's "stream"
    op), or not, one (its "identity" op: OUTPUT0 = INPUT0, INDEX = COUNT)."""
    if streaming is not None:
        made = {"name": MODEL, "backend": "python", "max_batch_size": 0,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
                          {"name": "COUNT", "data_type": "TYPE_INT32", "dims": [1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
                           {"name": "INDEX", "data_type": "TYPE_INT32", "dims": [1]}],
                "instance_group": [{"kind": "KIND_CPU", "count": 1}],
                "parameters": {"op": {"string_value": "stream" if streaming else "identity"}}}
        if streaming:
            made["model_transaction_policy"] = {"decoupled": True}
        return made
    return {"name": MODEL, "backend": "python", "max_batch_size": max_batch_size,
            "input": [{"name": "INPUT0", "data_type": input_type, "dims": list(dims)}],
            "output": [{"name": output, "data_type": output_type, "dims": list(dims)}],
            "instance_group": [{"kind": "KIND_CPU", "count": 1}]}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("changing")
    bundled = bundled_model_repository()
    shutil.copy(bundled.parent / "_bundled_model.py", root)  # (model.py finds it four folders up)
    shutil.copytree(bundled / "identity_int32", root / "models" / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    return root / "models"


@pytest.fixture(scope="module")
def explicit_server(repository, fake_cudart_path):
    # (the FAKE CUDA runtime preloaded: it opens the fake's handles, for the GPU test)
    with start_or_skip(LocalServer(repository, extra_args=["--model-control-mode=explicit", "--exit-timeout-secs=1"],
                                   env=server_env(fake_cudart_path))) as srv:
        yield srv


@pytest.fixture
def load(explicit_server, repository):
    """load(**config): (re)load ``changing`` with that config; version 1 only, again, after."""
    control = grpcclient.InferenceServerClient(explicit_server.grpc_url)

    def load_with(**changes):
        control.load_model(MODEL, config=json.dumps(config(**changes)))

    load_with()
    yield load_with
    shutil.rmtree(repository / MODEL / "2", ignore_errors=True)
    control.load_model(MODEL, config=json.dumps(config()))
    control.close()


def run(aio: bool, protocol: str, url: str, calls) -> list:
    """``calls(client)`` -> a list of awaitables (aio) or values, made on a fresh client."""
    async def main():
        c = (tritonshm.aio.Client if aio else tritonshm.Client)(url)
        try:
            results = []
            for call in calls:
                outcome = call(c)
                results.append(await outcome if aio else outcome)
            return results
        finally:
            await c.close() if aio else c.close()

    return asyncio.run(main())


both_ways = pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])


def reloading(load, aio: bool, **changes):
    """A step of :func:`run` that reloads the model with *changes* (off the event loop, for aio)."""
    return lambda c: asyncio.to_thread(load, **changes) if aio else load(**changes)


def infer(x):
    """A step of :func:`run` that infers on *x*."""
    return lambda c: c.infer(MODEL, {"INPUT0": x})


@pytest.mark.server
@both_ways
def test_an_output_whose_datatype_changed_is_read_as_it_is_now(explicit_server, load, protocol, aio):
    x = np.arange(3, dtype=np.int32)
    first, second, _, third, fourth = run(aio, protocol, client_url(explicit_server, protocol), [
        infer(x), infer(x),  # (the second by the quick path)
        reloading(load, aio, output_type="TYPE_FP32"), infer(x), infer(x)])
    assert first["OUTPUT0"].dtype == second["OUTPUT0"].dtype == np.int32
    for out in (third, fourth):  # (it read [0, 1065353216, 1073741824]: FP32's bits as INT32)
        assert out["OUTPUT0"].dtype == np.float32
        np.testing.assert_array_equal(out["OUTPUT0"], [0.0, 1.0, 2.0])


@pytest.mark.server
def test_a_gpu_request_seen_before_is_planned_again_on_a_changed_model(explicit_server, load, protocol, fake_cuda,
                                                                     torch_caching):
    """A GPU request seen before takes the plan made then (nothing checked or routed again): a
    model that changed is planned again, not run on that plan a second time (on the FAKE CUDA
    runtime: a lent input, results copied out of a CUDA slot)."""
    x = torch_caching.from_numpy(np.arange(3, dtype=np.int32))
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        for _ in range(2):  # (the second by the plan seen before)
            assert c.infer(MODEL, {"INPUT0": x})["OUTPUT0"].dtype == np.int32
        load(output_type="TYPE_FP32")
        for _ in range(2):
            out = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
            assert out.dtype == np.float32
            np.testing.assert_array_equal(out.get(), [0.0, 1.0, 2.0])
            del out
        y = torch_caching.empty(3, np.int32)  # out= of the datatype the model had: refused now
        with pytest.raises(tritonshm.DTypeMismatch, match="out.*OUTPUT0.*FP32"):
            c.infer(MODEL, {"INPUT0": x}, out={"OUTPUT0": y})


@pytest.mark.server
@both_ways
def test_an_output_renamed_is_returned_by_its_new_name(explicit_server, load, protocol, aio):
    x = np.arange(3, dtype=np.int32)
    first, _, after = run(aio, protocol, client_url(explicit_server, protocol), [
        infer(x), reloading(load, aio, output="RENAMED"),
        infer(x)])  # (the server refused OUTPUT0: "unexpected inference output")
    assert list(first) == ["OUTPUT0"] and list(after) == ["RENAMED"]
    np.testing.assert_array_equal(after["RENAMED"], x)


@pytest.mark.server
@both_ways
def test_an_input_whose_datatype_changed_is_taken_as_it_is_now(explicit_server, load, protocol, aio):
    x = np.arange(3, dtype=np.int32)
    _, _, after = run(aio, protocol, client_url(explicit_server, protocol), [
        infer(x), reloading(load, aio, input_type="TYPE_FP32"),
        infer(x.astype(np.float32))])  # (refused before: "input 'INPUT0' ... is INT32", what the client had read)
    np.testing.assert_array_equal(after["OUTPUT0"], x)


@pytest.mark.server
def test_a_new_version_is_read_and_the_request_run_on_it(explicit_server, load, repository, protocol):
    """A version 2 appears: the server runs it for a request that names none, and says so in its
    answer; the client, which read version 1, reads the model again."""
    x = np.arange(3, dtype=np.int32)
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        c.infer(MODEL, {"INPUT0": x})
        assert c.model_info(MODEL).versions == ("1",)
        shutil.copytree(repository / MODEL / "1", repository / MODEL / "2",
                        ignore=shutil.ignore_patterns("__pycache__"))
        load(output_type="TYPE_FP32")  # (the latest version only: 2)
        out = c.infer(MODEL, {"INPUT0": x})
        np.testing.assert_array_equal(out["OUTPUT0"], [0.0, 1.0, 2.0])
        assert c.model_info(MODEL).versions == ("2",)


@pytest.mark.server
def test_a_sequence_step_is_not_run_again_on_a_changed_model(explicit_server, load, protocol):
    """A request that may not run twice fails saying what changed (the server ran it once); the
    next one runs on the model as it is now."""
    x = np.arange(3, dtype=np.int32)
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        c.infer(MODEL, {"INPUT0": x})
        load(output_type="TYPE_FP32")
        with pytest.raises(tritonshm.ModelChanged, match="(?s)OUTPUT0.*FP32.*may not run twice"):
            c.infer(MODEL, {"INPUT0": x}, idempotent=False)
        np.testing.assert_array_equal(c.infer(MODEL, {"INPUT0": x}, idempotent=False)["OUTPUT0"], [0.0, 1.0, 2.0])


@pytest.mark.server
def test_the_facade_reports_the_version_that_ran_and_its_outputs_as_they_are_now(explicit_server, load, repository,
                                                                                protocol):
    """tritonshm.grpc / .http: after a version 2 appears with another output datatype, the result
    says version 2 ran (it said '1', read once per model) and its output reads as FP32."""
    import importlib

    module = importlib.import_module(f"tritonshm.{protocol}")
    url = explicit_server.grpc_url if protocol == "grpc" else explicit_server.http_url
    x = np.arange(3, dtype=np.int32)
    client = module.InferenceServerClient(url)
    try:
        def infer():
            given = module.InferInput("INPUT0", [3], "INT32")
            given.set_data_from_numpy(x)
            return client.infer(MODEL, [given])

        def version_of(result):
            response = result.get_response()
            return response["model_version"] if isinstance(response, dict) else response.model_version

        assert version_of(infer()) == "1"
        shutil.copytree(repository / MODEL / "1", repository / MODEL / "2",
                        ignore=shutil.ignore_patterns("__pycache__"))
        load(output_type="TYPE_FP32")
        result = infer()
        assert version_of(result) == "2"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(3, dtype=np.float32))
        assert result.as_numpy("OUTPUT0").dtype == np.float32
    finally:
        client.close()


@pytest.mark.server
def test_the_facade_raises_the_servers_words_for_a_model_unloaded_under_it(explicit_server, load, protocol):
    """tritonshm.grpc / .http: a model unloaded after the client used it raises what tritonclient's
    call raises, the server's own "unknown model" (it raised tritonshm's UnknownModel text, listing
    the models -- the unloaded one among them)."""
    import importlib

    url = explicit_server.grpc_url if protocol == "grpc" else explicit_server.http_url
    x = np.arange(3, dtype=np.int32)
    seen = []
    for module in (importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")):
        load()
        client = module.InferenceServerClient(url)
        try:
            given = module.InferInput("INPUT0", [3], "INT32")
            given.set_data_from_numpy(x)
            client.infer(MODEL, [given])
            client.unload_model(MODEL)
            with pytest.raises(module.InferenceServerException) as raised:
                client.infer(MODEL, [given])
            seen.append((raised.value.status(), raised.value.message(),
                         str(raised.value), isinstance(raised.value, LookupError)))
        finally:
            client.close()
    assert seen[0][1] == f"Request for unknown model: '{MODEL}' has no available versions"
    assert seen[1] == seen[0]


# -- what the model's config no longer takes; the other ways in: stream(), request() ------------


@pytest.mark.server
def test_a_smaller_max_batch_size_is_read_again_and_the_batch_split(explicit_server, load, protocol):
    """max_batch_size 8 -> 2 under a client that ran batches of 4: the server's refusal ("batch-size
    must be <= 2") makes the client read the model again, and the next call splits the batch.
    (Before, every call was refused, for ever: the client never read the model again.)"""
    load(max_batch_size=8, dims=(4,))
    x = np.arange(16, dtype=np.int32).reshape(4, 4)
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        for _ in range(2):
            np.testing.assert_array_equal(c.infer(MODEL, {"INPUT0": x})["OUTPUT0"], x)
        load(max_batch_size=2, dims=(4,))
        with pytest.raises(tritonshm.ServerError, match="batch-size must be <= 2|now runs in chunks"):
            c.infer(MODEL, {"INPUT0": x})
        assert c.model_info(MODEL).max_batch_size == 2
        np.testing.assert_array_equal(c.infer(MODEL, {"INPUT0": x})["OUTPUT0"], x)


@pytest.mark.server
def test_a_decoupled_model_made_plain_runs_by_infer(explicit_server, load):
    """A model the client streamed as decoupled, reloaded not decoupled: infer() reads it again and
    runs it (it raised "decoupled ... use stream()" against what it had read, for ever)."""
    load(streaming=True)
    x = {"INPUT0": np.arange(3, dtype=np.float32), "COUNT": np.array([2], np.int32)}
    with tritonshm.Client(explicit_server.grpc_url) as c:
        assert len(list(c.stream(MODEL, x))) == 2
        load(streaming=False)
        np.testing.assert_array_equal(c.infer(MODEL, x)["OUTPUT0"], x["INPUT0"])


@pytest.mark.server
def test_a_model_made_decoupled_says_to_stream(explicit_server, load, protocol):
    """A model the client ran by infer(), reloaded decoupled: the server's refusal makes the client
    read it again, and the next call says to stream (DecoupledModel) before sending anything."""
    load(streaming=False)
    x = {"INPUT0": np.arange(3, dtype=np.float32), "COUNT": np.array([2], np.int32)}
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        for _ in range(2):
            c.infer(MODEL, x)
        load(streaming=True)
        with pytest.raises(tritonshm.ServerError, match="decoupled transaction policy"):
            c.infer(MODEL, x)  # (the server's words)
        assert c.model_info(MODEL).decoupled
        with pytest.raises(tritonshm.DecoupledModel, match="use stream"):
            c.infer(MODEL, x)


@pytest.mark.server
@both_ways
def test_stream_reads_a_model_whose_input_datatype_changed(explicit_server, load, aio):
    """stream() with an FP32 input after INT32 -> FP32 runs (the model read again), as infer() does --
    it raised DTypeMismatch against what the client had read, for ever."""
    x = np.arange(3, dtype=np.int32)

    async def main():
        c = (tritonshm.aio.Client if aio else tritonshm.Client)(explicit_server.grpc_url)

        async def streamed(inputs):
            if aio:
                return [response async for response in c.stream(MODEL, inputs)]
            return list(c.stream(MODEL, inputs))

        try:
            assert len(await streamed({"INPUT0": x})) == 1
            await asyncio.to_thread(load, input_type="TYPE_FP32")
            (out,) = await streamed({"INPUT0": x.astype(np.float32)})
            np.testing.assert_array_equal(out["OUTPUT0"], x)
        finally:
            await c.close() if aio else c.close()

    asyncio.run(main())


@pytest.mark.server
def test_stream_after_an_output_renamed_returns_it_by_its_new_name(explicit_server, load):
    """The server's refusal of a streamed request ("unexpected inference output") makes the client
    read the model again: the next stream() returns RENAMED (OUTPUT0 was refused for ever)."""
    x = np.arange(3, dtype=np.int32)
    with tritonshm.Client(explicit_server.grpc_url) as c:
        assert len(list(c.stream(MODEL, {"INPUT0": x}))) == 1
        load(output="RENAMED")
        with pytest.raises(tritonshm.ServerError, match="unexpected inference output"):
            list(c.stream(MODEL, {"INPUT0": x}))
        (out,) = list(c.stream(MODEL, {"INPUT0": x}))
        assert list(out) == ["RENAMED"]


@pytest.mark.server
def test_a_zero_copy_request_after_an_input_datatype_changed(explicit_server, load, protocol):
    """request() after INT32 -> FP32: the run the server refuses ("data-type is 'INT32', but model
    ... expects 'FP32'") makes the client read the model again, and the next request() hands out
    FP32 views (they stayed INT32, each run refused, for ever)."""
    with tritonshm.Client(client_url(explicit_server, protocol)) as c:
        with c.request(MODEL, shapes={"INPUT0": (3,)}) as r:
            r.inputs["INPUT0"][...] = np.arange(3)
            r.run()
        load(input_type="TYPE_FP32")
        with c.request(MODEL, shapes={"INPUT0": (3,)}) as r:
            r.inputs["INPUT0"][...] = np.arange(3)
            with pytest.raises(tritonshm.ServerError, match="expects 'FP32'"):
                r.run()
        with c.request(MODEL, shapes={"INPUT0": (3,)}) as r:
            assert r.inputs["INPUT0"].dtype == np.float32
            r.inputs["INPUT0"][...] = np.arange(3)
            np.testing.assert_array_equal(r.run()["OUTPUT0"], np.arange(3))


@pytest.mark.server
def test_the_facade_raises_the_servers_words_for_an_input_of_a_datatype_no_longer_taken(explicit_server, load,
                                                                                        protocol):
    """tritonshm.grpc / .http: an INT32 input sent to the model reloaded with an FP32 input raises
    what tritonclient's call raises (the held client, which reads the model again, must not answer
    in its own words)."""
    import importlib

    url = explicit_server.grpc_url if protocol == "grpc" else explicit_server.http_url
    x = np.arange(40000, dtype=np.int32)  # (what the slots carry)
    seen = []
    for module in (importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")):
        load()
        client = module.InferenceServerClient(url)
        try:
            given = module.InferInput("INPUT0", [len(x)], "INT32")
            given.set_data_from_numpy(x)
            for _ in range(2):
                client.infer(MODEL, [given])
            load(input_type="TYPE_FP32")
            for _ in range(2):
                with pytest.raises(module.InferenceServerException) as raised:
                    client.infer(MODEL, [given])
                seen.append((raised.value.status(), raised.value.message()))
        finally:
            client.close()
    assert seen[2:] == seen[:2]
