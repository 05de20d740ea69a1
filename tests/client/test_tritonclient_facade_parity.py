"""tritonshm.grpc / tritonshm.http against tritonclient where they differed last (issue 39): a client
dropped with requests pending, a stream after "unregister everything", ``verbose=True``, and the
text of an error.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server (or a server of its own) and compares what the caller sees; the facade's calls are
checked to have gone through its slots.
"""

from __future__ import annotations

import gc
import importlib
import threading

import numpy as np
import pytest

from tritonshm.errors import InferenceServerException

pytestmark = pytest.mark.server


def modules(protocol):
    """(tritonclient's module, the facade's) for *protocol*."""
    return importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")


def connect(module, server, protocol, **kwargs):
    """A client of *module*; a facade's sends even its smallest calls through the slots."""
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url, **kwargs)
    if module.__name__.startswith("tritonshm"):
        client.tritonshm_inline_bytes = 0
    return client


def inputs_of(module, array, name="INPUT0", datatype="FP32"):
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return [inp]


# -- 1. a client dropped with async_infer calls pending -------------------------------------------


def dropped_with_pending(module, server, protocol, count):
    """async_infer *count* requests to slow_fp32 (500 ms each), drop the client at once, then
    wait for what they answer: results or errors, in order."""
    client = connect(module, server, protocol)
    arrays = [np.full(4, i, np.float32) for i in range(count)]
    if protocol == "grpc":
        answers, left = [None] * count, threading.Semaphore(0)

        def callback(index, result, error):
            answers[index] = error if error is not None else result.as_numpy("OUTPUT0")
            left.release()

        for i, x in enumerate(arrays):
            client.async_infer("slow_fp32", inputs_of(module, x),
                               lambda result, error, i=i: callback(i, result, error))
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        del client
        gc.collect()
        for _ in arrays:
            assert left.acquire(timeout=30), "a callback was never called"
    else:
        pending = [client.async_infer("slow_fp32", inputs_of(module, x)) for x in arrays]
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        del client
        gc.collect()
        answers = []
        for request in pending:
            try:
                answers.append(request.get_result(timeout=30).as_numpy("OUTPUT0"))
            except InferenceServerException as error:
                answers.append(error)
    return answers, slots, held


def test_a_dropped_client_finishes_its_pending_async_infer_as_tritonclients(server, protocol):
    plain_module, facade_module = modules(protocol)
    expected, _, _ = dropped_with_pending(plain_module, server, protocol, 3)
    got, slots, held = dropped_with_pending(facade_module, server, protocol, 3)
    assert [a.tolist() for a in expected] == [[float(i)] * 4 for i in range(3)]
    assert [a if isinstance(a, Exception) else a.tolist() for a in got] == [a.tolist() for a in expected]
    assert held is not None and held.pools(), "the facade sent its tensors over the wire"
    # Once they are done, the dropped client goes, and its slots with it.
    del got
    for _ in range(100):
        gc.collect()
        if slots.client is None:
            break
        threading.Event().wait(0.05)
    assert slots.client is None, "the dropped client's slots were never released"


# -- 2. a stream after unregister_system_shared_memory() of everything ---------------------------


def stream_request(module, count, value=1.0):
    """stream_fp32's inputs: *count* responses, OUTPUT0 = INPUT0 + i."""
    return [module.InferInput("INPUT0", [3], "FP32").set_data_from_numpy(np.full(3, value, np.float32)),
            module.InferInput("COUNT", [1], "INT32").set_data_from_numpy(np.array([count], np.int32))]


def heard(result, error):
    """What a stream's callback heard, comparable across modules."""
    if error is not None:
        return ("error", error.status(), error.message())
    response = result.get_response()
    return ("result", response.id, result.as_numpy("OUTPUT0").tolist())


def unregister_everything(client):
    """``unregister_system_shared_memory()`` of every region, asked again while the server still
    uses one (a request's final response may come before it let go of the request's region)."""
    for _ in range(100):
        try:
            return client.unregister_system_shared_memory()
        except InferenceServerException as error:
            if "Failed to unregister" not in error.message():
                raise
            threading.Event().wait(0.05)
    raise AssertionError("the server never let go of a region")


async def unregister_everything_aio(client):
    """:func:`unregister_everything` of an aio client."""
    import asyncio

    for _ in range(100):
        try:
            return await client.unregister_system_shared_memory()
        except InferenceServerException as error:
            if "Failed to unregister" not in error.message():
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("the server never let go of a region")


def stream_after_unregister_all(module, server):
    """A stream's request answered, then unregister_system_shared_memory() (every region), then
    more requests on the same stream: what the callback heard, and the facade's pools."""
    answers, first = [], threading.Event()
    client = module.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: (answers.append(heard(result, error)), first.set()))
        client.async_stream_infer("stream_fp32", stream_request(module, 1, 0.0), request_id="before")
        assert first.wait(30)
        unregister_everything(client)
        for i in range(3):
            client.async_stream_infer("stream_fp32", stream_request(module, 2, float(i + 1)), request_id=f"after{i}")
        client.stop_stream()
        held = getattr(client, "tritonshm", None)
        return sorted(answers), None if held is None else held.pools()
    finally:
        client.close()


def test_a_stream_goes_on_after_unregister_everything_as_tritonclients(server):
    plain_module, facade_module = modules("grpc")
    expected, _ = stream_after_unregister_all(plain_module, server)
    got, pools = stream_after_unregister_all(facade_module, server)
    assert len(expected) == 7 and all(kind == "result" for kind, *_ in expected)
    assert got == expected
    assert pools and all(pool.running == 0 and pool.held == 0 for pool in pools), \
        "the facade sent the stream's inputs over the wire, or kept a slot"


def test_an_aio_stream_goes_on_after_unregister_everything_as_tritonclients(server):
    import asyncio

    async def run(module):
        client = module.InferenceServerClient(server.grpc_url)
        try:
            first = asyncio.Event()

            async def requests():
                yield {"model_name": "stream_fp32", "inputs": stream_request(module, 1, 0.0), "request_id": "before"}
                await first.wait()
                await unregister_everything_aio(client)
                for i in range(3):
                    yield {"model_name": "stream_fp32", "inputs": stream_request(module, 2, float(i + 1)),
                           "request_id": f"after{i}"}

            answers = []
            async for result, error in client.stream_infer(requests()):
                answers.append(heard(result, error))
                first.set()
            held = getattr(client, "tritonshm", None)
            return sorted(answers), None if held is None else held.pools()
        finally:
            await client.close()

    import tritonclient.grpc.aio
    import tritonshm.grpc.aio

    expected, _ = asyncio.run(run(tritonclient.grpc.aio))
    got, pools = asyncio.run(run(tritonshm.grpc.aio))
    assert len(expected) == 7 and all(kind == "result" for kind, *_ in expected)
    assert got == expected
    assert pools and all(pool.running == 0 and pool.held == 0 for pool in pools)


# -- 4. the text of an error -------------------------------------------------------------------


def error_seen(error, like=None):
    """What a caller reads of an error: its text, and tritonclient's accessors where it has them
    (where tritonclient's error, *like*, has none -- tritonclient.http's network timeout is the
    builtin TimeoutError -- a facade's may add them: not compared)."""
    message = getattr(like if like is not None else error, "message", None)
    status = getattr(like if like is not None else error, "status", None)
    return {"str": str(error), "message": error.message() if callable(message) else None,
            "status": error.status() if callable(status) else None}


def failing_call(module, client, protocol, case, way):
    """One call that fails (*case*: the server refuses it, or it times out), made *way*: the
    error, as the caller gets it."""
    if case == "refused":  # a sequence's first request without its START flag: the server's 400
        model, x, options = "accumulate_fp32", np.ones((1, 3), np.float32), {"sequence_id": 4391}
    else:  # slow_fp32 answers after 500 ms
        model, x, options = "slow_fp32", np.ones(4, np.float32), {"client_timeout": 0.1} if protocol == "grpc" else {}
    inputs = inputs_of(module, x)
    try:
        if way == "infer":
            client.infer(model, inputs, **options)
        elif protocol == "grpc":
            heard = []
            done = threading.Event()
            client.async_infer(model, inputs, lambda result, error: (heard.append(error), done.set()), **options)
            assert done.wait(30)
            return heard[0]
        else:
            client.async_infer(model, inputs, **options).get_result(timeout=30)
    except Exception as error:
        return error
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize("way", ["infer", "async_infer"])
@pytest.mark.parametrize("case", ["refused", "timeout"])
def test_an_error_reads_as_tritonclients(server, protocol, case, way):
    errors = []
    # HTTP's timeout is the client's network_timeout (tritonclient.http's infer takes no client_timeout)
    kwargs = {"network_timeout": 0.2} if protocol == "http" and case == "timeout" else {}
    for module in modules(protocol):
        client = connect(module, server, protocol, **kwargs)
        try:
            errors.append(failing_call(module, client, protocol, case, way))
            if module.__name__.startswith("tritonshm"):
                assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
        finally:
            threading.Event().wait(0.6)  # slow_fp32 done with it: the next client's request waits for none
            client.close()
    expected, got = errors
    assert error_seen(got, like=expected) == error_seen(expected)
    if isinstance(expected, TimeoutError):  # tritonclient.http's: gevent's socket timeout
        assert isinstance(got, TimeoutError) and got.args == expected.args and str(expected) == "timed out"
    elif case == "refused":
        assert str(expected) == f"[{expected.status()}] {expected.message()}"
    else:
        assert expected.message() == "Deadline Exceeded"


@pytest.mark.parametrize("case", ["refused", "timeout"])
def test_an_aio_error_reads_as_tritonclients(server, protocol, case):
    import asyncio

    # HTTP's timeout is the client's conn_timeout (tritonclient.http.aio's infer takes no client_timeout)
    kwargs = {"conn_timeout": 0.2} if protocol == "http" and case == "timeout" else {}

    async def run(module):
        client = connect(module, server, protocol, **kwargs)
        try:
            if case == "refused":
                await client.infer("accumulate_fp32", inputs_of(module, np.ones((1, 3), np.float32)),
                                   sequence_id=4392)
            else:
                await client.infer("slow_fp32", inputs_of(module, np.ones(4, np.float32)),
                                   **({"client_timeout": 0.1} if protocol == "grpc" else {}))
        except Exception as error:
            if module.__name__.startswith("tritonshm"):
                assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
            return error
        finally:
            await asyncio.sleep(0.6)  # slow_fp32 done with it
            await client.close()
        raise AssertionError("the call did not fail")

    expected = asyncio.run(run(importlib.import_module(f"tritonclient.{protocol}.aio")))
    got = asyncio.run(run(importlib.import_module(f"tritonshm.{protocol}.aio")))
    assert error_seen(got, like=expected) == error_seen(expected)
    if isinstance(expected, TimeoutError):  # tritonclient.http.aio's: aiohttp's
        assert isinstance(got, TimeoutError) and got.args == expected.args
    elif case == "refused":
        assert str(expected) == f"[{expected.status()}] {expected.message()}"
    else:
        assert expected.message() == "Deadline Exceeded"
