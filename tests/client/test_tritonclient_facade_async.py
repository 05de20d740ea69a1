"""tritonshm.grpc / .http ``async_infer`` and tritonshm.grpc.aio / .http.aio ``infer``: a tritonclient
script with its import line changed does what it did, its tensors through the facade's slots.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server, several requests in flight at once, and compares what came back (arrays, dtypes,
shapes, ``get_output``, ``get_response``, errors and their ``status()``); the facade's answers are
checked to be the slots' results and its held client to have pools -- so a call that silently
went over the wire fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import threading
import time

import numpy as np
import pytest

from tritonshm.errors import InferenceServerException
from tritonshm.facade import _route
from triton_fixtures import registered_regions, wait_until

N = 8  # requests in flight at once

CASES = {
    "identity_fp32": (lambda i: {"INPUT0": np.arange(1000, dtype=np.float32) + i}, ["FP32"], ["OUTPUT0"]),
    "identity_bytes": (lambda i: {"INPUT0": np.array([b"a%d" % i, b"", b"\x00\xff" * i], dtype=object)},
                       ["BYTES"], ["OUTPUT0"]),
    "add_sub": (lambda i: {"INPUT0": np.arange(16, dtype=np.float32) * i, "INPUT1": np.full(16, 2, np.float32)},
                ["FP32", "FP32"], ["OUTPUT0", "OUTPUT1"]),
}


def modules(protocol, aio=False):
    """(tritonclient's module, the facade's) for *protocol*."""
    tail = ".aio" if aio else ""
    return (importlib.import_module(f"tritonclient.{protocol}{tail}"),
            importlib.import_module(f"tritonshm.{protocol}{tail}"))


def connect(module, server, protocol):
    """A client of *module*; a facade's sends even its smallest calls through the slots (these
    tests are about what the slots carry; gRPC's inline small calls have their own test)."""
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    if module.__name__.startswith("tritonshm"):
        client.tritonshm_inline_bytes = 0
    return client


def request_of(module, arrays, datatypes, outputs):
    """What a tritonclient user writes: InferInputs with set_data_from_numpy, InferRequestedOutputs."""
    inputs = []
    for (name, array), datatype in zip(arrays.items(), datatypes):
        inp = module.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs, None if outputs is None else [module.InferRequestedOutput(name) for name in outputs]


def run_async_infer(module, client, protocol, model, requests):
    """tritonclient's async_infer for each of *requests* (all sent before any is waited for): the
    results, or the errors, in order -- gRPC through the callback, HTTP through get_result()."""
    if protocol == "grpc":
        answers = [None] * len(requests)
        left = threading.Semaphore(0)

        def callback(index, result, error):
            answers[index] = error if error is not None else result
            left.release()

        for index, (inputs, outputs) in enumerate(requests):
            client.async_infer(model, inputs, lambda result, error, index=index: callback(index, result, error),
                               outputs=outputs)
        for _ in requests:
            assert left.acquire(timeout=30), "a callback was never called"
        return answers
    pending = [client.async_infer(model, inputs, outputs=outputs) for inputs, outputs in requests]
    answers = []
    for request in pending:
        try:
            answers.append(request.get_result(timeout=30))
        except InferenceServerException as error:
            answers.append(error)
    return answers


async def run_aio_infer(client, model, requests):
    """tritonclient's aio infer for each of *requests*, all awaited together: results or errors."""
    return await asyncio.gather(*(client.infer(model, inputs, outputs=outputs) for inputs, outputs in requests),
                                return_exceptions=True)


def assert_same_results(got, expected, facade_module, output_names):
    """The facade's answers are the slots' results, and answer as tritonclient's did."""
    assert len(got) == len(expected)
    for have, want in zip(got, expected):
        assert isinstance(have, facade_module.InferResult)
        assert type(have) is not facade_module.InferResult, "the facade sent its tensors over the wire"
        for name in output_names:
            a, b = have.as_numpy(name), want.as_numpy(name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist()
            assert have.get_output(name) == want.get_output(name)
        assert have.get_response() == want.get_response()


def assert_same_errors(got, expected):
    for have, want in zip(got, expected):
        assert isinstance(want, InferenceServerException) and isinstance(have, InferenceServerException)
        assert (have.status(), have.message()) == (want.status(), want.message())


def script_requests(module, model, given_outputs=True):
    make, datatypes, outputs = CASES[model]
    return [request_of(module, make(i), datatypes, outputs if given_outputs else None) for i in range(N)]


def bad_requests(module):
    """An input name the model lacks: tritonclient's own call, the server's error."""
    return [request_of(module, {"NOT_AN_INPUT": np.zeros(4, np.float32)}, ["FP32"], None) for _ in range(2)]


# -- async_infer ------------------------------------------------------------------


@pytest.fixture
def both(server, protocol):
    """(tritonclient's module and client, the facade's module and client)."""
    plain_module, facade_module = modules(protocol)
    plain, facade = connect(plain_module, server, protocol), connect(facade_module, server, protocol)
    yield plain_module, plain, facade_module, facade
    plain.close()
    facade.close()


@pytest.mark.server
@pytest.mark.parametrize("model", sorted(CASES))
@pytest.mark.parametrize("given_outputs", [True, False], ids=["outputs", "no-outputs"])
def test_async_infer_gives_tritonclients_results(both, protocol, model, given_outputs):
    plain_module, plain, facade_module, facade = both
    expected = run_async_infer(plain_module, plain, protocol, model, script_requests(plain_module, model, given_outputs))
    got = run_async_infer(facade_module, facade, protocol, model, script_requests(facade_module, model, given_outputs))
    assert_same_results(got, expected, facade_module, CASES[model][2])
    assert facade.tritonshm.pools(), "the facade sent its tensors over the wire"


@pytest.mark.server
def test_async_infer_errors_arrive_as_tritonclients(both, protocol):
    plain_module, plain, facade_module, facade = both
    expected = run_async_infer(plain_module, plain, protocol, "identity_fp32", bad_requests(plain_module))
    got = run_async_infer(facade_module, facade, protocol, "identity_fp32", bad_requests(facade_module))
    assert_same_errors(got, expected)


@pytest.mark.server
def test_async_infer_reads_the_inputs_at_the_call(both, protocol):
    """Setting an InferInput's data again after async_infer returned does not change what was sent."""
    _, _, facade_module, facade = both
    inp = facade_module.InferInput("INPUT0", [64], "FP32")
    inp.set_data_from_numpy(np.full(64, 1, np.float32))
    results = []
    for value in (2, 3):
        results.append(run_async_infer(facade_module, facade, protocol, "identity_fp32", [([inp], None)]))
        inp.set_data_from_numpy(np.full(64, value, np.float32))
    assert [r[0].as_numpy("OUTPUT0")[0] for r in results] == [1, 2]


@pytest.mark.server
def test_async_infer_of_a_call_the_slots_do_not_take_is_tritonclients(both, protocol):
    _, _, facade_module, facade = both
    inputs, outputs = request_of(facade_module, {"INPUT0": np.arange(4, dtype=np.float32)}, ["FP32"], None)
    if protocol == "grpc":
        seen = concurrent.futures.Future()
        facade.async_infer("identity_fp32", inputs, lambda result, error: seen.set_result((result, error)),
                           request_id="mine")
        result, error = seen.result(timeout=30)
    else:
        request = facade.async_infer("identity_fp32", inputs, request_id="mine")
        assert type(request) is facade_module.InferAsyncRequest
        result, error = request.get_result(), None
    assert error is None and type(result) is facade_module.InferResult  # over the wire, as asked
    assert result.get_response()["id"] if protocol == "http" else result.get_response().id == "mine"


def test_get_result_of_a_request_not_answered_yet_says_so_as_tritonclient():
    import tritonshm.http as facade_http

    request = facade_http._SlotAsyncRequest(concurrent.futures.Future())
    assert isinstance(request, facade_http.InferAsyncRequest)
    for kwargs in ({"block": False}, {"timeout": 0.01}):
        with pytest.raises(InferenceServerException) as caught:
            request.get_result(**kwargs)
        assert caught.value.message() == "failed to obtain inference response" and caught.value.status() is None


def test_a_cancelled_grpc_call_tells_the_callback_as_tritonclient():
    seen = []
    pending = concurrent.futures.Future()
    pending.add_done_callback(lambda done: _route.answer_callback(lambda result, error: seen.append((result, error)),
                                                                  done))
    _route.SlotCallContext(pending).cancel()
    [(result, error)] = seen
    assert result is None and error.status() == "StatusCode.CANCELLED"
    assert error.message() == "Locally cancelled by application!"


def slot_names(client) -> set[str]:
    """The names of a facade's slot regions (none for tritonclient's own client)."""
    held = getattr(client, "tritonshm", None)
    return set() if held is None else {name for pool in held.pools() for name in pool.regions}


def pending_slow_requests(module, client, count=3):
    """*count* requests to slow_fp32 (0.5 s each, one at a time) sent with async_infer, the first on
    the server: their answers (result or error), as each callback hears it."""
    answers, heard = [], threading.Semaphore(0)

    def callback(result, error):
        answers.append(error if error is not None else result)
        heard.release()

    for inputs, _ in [request_of(module, {"INPUT0": np.ones(4096, np.float32)}, ["FP32"], None)] * count:
        client.async_infer("slow_fp32", inputs, callback)
    time.sleep(0.2)  # (the first on the server now: answered at 0.5 s)
    return answers, heard


def http_sequences_by_async_infer(module, server, first_id, sequences=6, steps=4):
    """*sequences* sequences of *steps* steps on accumulate_fp32 (a running sum per sequence id),
    every step sent with async_infer before any answer is read: the sums, or the errors."""
    client = connect(module, server, "http")
    try:
        pending = []
        for sequence in range(sequences):
            for step in range(steps):
                inputs, _ = request_of(module, {"INPUT0": np.full((1, 3), 1.0 + step, np.float32)}, ["FP32"], None)
                pending.append(client.async_infer("accumulate_fp32", inputs, sequence_id=first_id + sequence,
                                                  sequence_start=step == 0, sequence_end=step == steps - 1))
        answers = []
        for request in pending:
            try:
                answers.append(float(request.get_result(timeout=60).as_numpy("OUTPUT0")[0, 0]))
            except InferenceServerException as error:
                answers.append(f"[{error.status()}] {error.message()}")
        if module.__name__.startswith("tritonshm"):
            assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
        return answers
    finally:
        client.close()


@pytest.mark.server
def test_http_async_infer_sends_a_sequences_steps_in_order_as_tritonclient(server):
    """tritonclient.http's async_infer runs ``concurrency`` requests at a time (one by default), in
    the order made: every running sum is right.  (The facade ran them on as many threads as its
    slots: steps reached the server out of order -- "must specify the START flag", wrong sums.)"""
    plain_module, facade_module = modules("http")
    expected = http_sequences_by_async_infer(plain_module, server, 1 << 20)
    assert expected == [float(sum(1.0 + j for j in range(step + 1))) for _ in range(6) for step in range(4)]
    assert http_sequences_by_async_infer(facade_module, server, 1 << 21) == expected


@pytest.mark.server
def test_grpc_close_cancels_the_requests_still_pending_as_tritonclients(server):
    """tritonclient's close() closes its channel under the requests: each callback hears
    CANCELLED at once.  The facade's does the same; what the server still runs keeps its slot
    until the server is done (tests/client/test_close_cancelling.py)."""
    ends = []
    for module in modules("grpc"):
        client = connect(module, server, "grpc")
        answers, heard = pending_slow_requests(module, client)
        names = slot_names(client)
        client.close()
        for _ in range(3):
            assert heard.acquire(timeout=30), "a callback was never called"
        assert all(isinstance(a, InferenceServerException) for a in answers), answers  # none answered
        ends.append(sorted(a.status() for a in answers))
        wait_until(lambda: not names & registered_regions(server), 15)  # once the server let go
    assert ends[0] == ends[1] == ["StatusCode.CANCELLED"] * 3


# -- aio -----------------------------------------------------------------------------


async def both_aio(server, protocol, scenario):
    plain_module, facade_module = modules(protocol, aio=True)
    plain, facade = connect(plain_module, server, protocol), connect(facade_module, server, protocol)
    try:
        return await scenario(plain_module, plain, facade_module, facade)
    finally:
        await plain.close()
        await facade.close()


@pytest.mark.server
@pytest.mark.parametrize("model", sorted(CASES))
def test_aio_infer_gives_tritonclients_results(server, protocol, model):
    async def scenario(plain_module, plain, facade_module, facade):
        expected = await run_aio_infer(plain, model, script_requests(plain_module, model))
        got = await run_aio_infer(facade, model, script_requests(facade_module, model))
        assert_same_results(got, expected, facade_module, CASES[model][2])
        assert facade.tritonshm.pools(), "the facade sent its tensors over the wire"
        assert all(pool.regions for pool in facade.tritonshm.pools())

    asyncio.run(both_aio(server, protocol, scenario))


@pytest.mark.server
def test_aio_infer_errors_arrive_as_tritonclients(server, protocol):
    async def scenario(plain_module, plain, facade_module, facade):
        expected = await run_aio_infer(plain, "identity_fp32", bad_requests(plain_module))
        got = await run_aio_infer(facade, "identity_fp32", bad_requests(facade_module))
        assert_same_errors(got, expected)

    asyncio.run(both_aio(server, protocol, scenario))


@pytest.mark.server
def test_aio_close_releases_the_slots(server, protocol):
    import tritonshm

    async def scenario():
        _, facade_module = modules(protocol, aio=True)
        async with connect(facade_module, server, protocol) as facade:
            inputs, _ = request_of(facade_module, {"INPUT0": np.ones(4, np.float32)}, ["FP32"], None)
            await facade.infer("identity_fp32", inputs)
            names = {n for pool in facade.tritonshm.pools() for n in pool.regions}
            assert names
        assert facade.tritonshm is None
        return names

    names = asyncio.run(scenario())
    plain_module, _ = modules(protocol)
    with connect(plain_module, server, protocol) as other:
        assert not names & set(tritonshm.status(other))


@pytest.mark.server
def test_aio_close_ends_the_requests_still_pending_as_tritonclients(server, protocol):
    """grpc.aio ends the calls of a channel closed under them with a cancellation, aiohttp those of
    a session closed under them with ServerDisconnectedError: so do the facades' (they waited)."""
    async def scenario(module):
        client = connect(module, server, protocol)
        inputs, _ = request_of(module, {"INPUT0": np.ones(4096, np.float32)}, ["FP32"], None)
        pending = [asyncio.ensure_future(client.infer("slow_fp32", inputs)) for _ in range(3)]
        await asyncio.sleep(0.2)  # (the first on the server now: answered at 0.5 s)
        names = slot_names(client)
        await client.close()
        ends = [type(end) for end in await asyncio.gather(*pending, return_exceptions=True)]
        return ends, names

    ends = []
    for module in modules(protocol, aio=True):
        got, names = asyncio.run(scenario(module))
        ends.append(got)
        wait_until(lambda: not names & registered_regions(server), 15)  # once the server let go
    if protocol == "grpc":
        assert ends[0] == [asyncio.CancelledError] * 3
    else:
        import aiohttp

        assert ends[0] == [aiohttp.ServerDisconnectedError] * 3
    assert ends[1] == ends[0]


# -- the modules -------------------------------------------------------------------------


def shape(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_aio_facades_export_every_public_name_of_tritonclients(protocol):
    plain_module, facade_module = modules(protocol, aio=True)
    for name in dir(plain_module):
        if not name.startswith("_") and name not in ("InferenceServerClient", "InferInput"):
            assert getattr(facade_module, name) is getattr(plain_module, name), name
    blocking = importlib.import_module(f"tritonshm.{protocol}")
    assert facade_module.InferInput is blocking.InferInput  # as tritonclient's aio module has its blocking one's
    assert plain_module.InferInput is importlib.import_module(f"tritonclient.{protocol}").InferInput
    client_class = facade_module.InferenceServerClient
    assert issubclass(client_class, plain_module.InferenceServerClient)
    assert inspect.signature(client_class) == inspect.signature(plain_module.InferenceServerClient)
    assert shape(client_class.infer) == shape(plain_module.InferenceServerClient.infer)
    assert inspect.iscoroutinefunction(client_class.infer) and inspect.iscoroutinefunction(client_class.close)


def test_async_infer_takes_tritonclients_arguments(protocol):
    plain_module, facade_module = modules(protocol)
    assert shape(facade_module.InferenceServerClient.async_infer) == \
        shape(plain_module.InferenceServerClient.async_infer)


def test_the_facades_aio_is_ours_even_after_tritonclients_was_imported(protocol):
    plain_module, facade_module = modules(protocol)
    importlib.import_module(f"tritonclient.{protocol}.aio")
    assert "aio" in dir(plain_module)  # tritonclient's module now names its aio
    ours = importlib.import_module(f"tritonshm.{protocol}.aio")
    assert facade_module.aio is ours
    assert issubclass(ours.InferenceServerClient, plain_module.aio.InferenceServerClient)
