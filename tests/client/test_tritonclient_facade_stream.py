"""tritonshm.grpc's stream (start_stream / async_stream_infer / stop_stream) and tritonshm.grpc.aio's
stream_infer: a tritonclient script with its import line changed hears what it heard, each
request's inputs through the facade's slots.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server and compares what the callbacks heard, request by request in the order they
heard it (the server may interleave different requests' responses differently run to run;
within a request the order is the server's), as tritonclient's objects: the response messages
themselves, arrays, errors with their ``status()``.  The facade's held client must have slot
pools afterwards, all of them free -- so a stream that silently sent its inputs over the wire,
or kept a slot, fails.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import tritonclient.grpc
import tritonclient.grpc.aio
import tritonshm.grpc
import tritonshm.grpc.aio
from tritonshm.errors import InferenceServerException

pytestmark = pytest.mark.server

PAIRS = [(tritonclient.grpc, "plain"), (tritonshm.grpc, "facade")]


def stream_request(module, count, value=1.0, length=3):
    """stream_fp32's inputs: *count* responses, OUTPUT0 = INPUT0 + i."""
    data = module.InferInput("INPUT0", [length], "FP32")
    data.set_data_from_numpy(np.full(length, value, np.float32))
    responses = module.InferInput("COUNT", [1], "INT32")
    responses.set_data_from_numpy(np.array([count], np.int32))
    return [data, responses]


def heard(result, error):
    """What a callback heard, comparable across modules: the response message (its id, outputs,
    parameters and raw contents) or the error's message and status."""
    if error is not None:
        assert isinstance(error, InferenceServerException) and result is None
        return ("error", error.message(), error.status())
    assert type(result) is tritonclient.grpc.InferResult  # the server's response: outputs on the wire
    return ("result", result.get_response().SerializeToString(deterministic=True))


def by_request(answers):
    """The answers grouped by the request they answer (in the order heard), errors apart."""
    groups = {}
    for kind, *rest in answers:
        if kind == "error":
            groups.setdefault("errors", []).append(tuple(rest))
        else:
            response = tritonclient.grpc.service_pb2.ModelInferResponse.FromString(rest[0])
            groups.setdefault(response.id, []).append(rest[0])
    if "errors" in groups:
        groups["errors"].sort(key=repr)
    return groups


def run_stream(module, server, requests, **stream_options):
    """A tritonclient stream script: start_stream, async_stream_infer each of *requests* (a
    function of the module giving a list of (args, kwargs)), stop_stream; what the callback
    heard, in order, and the client (closed)."""
    answers = []
    client = module.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: answers.append(heard(result, error)), **stream_options)
        for args, kwargs in requests(module):
            client.async_stream_infer(*args, **kwargs)
        client.stop_stream()
        return answers, client
    finally:
        pools = client.tritonshm.pools() if isinstance(client, tritonshm.grpc.InferenceServerClient) and \
            client.tritonshm is not None else None
        client.close()
        client.pools_seen = pools


def both_ways(server, requests, **stream_options):
    """(tritonclient's answers, the facade's answers, the facade's pools seen before close)."""
    plain, _ = run_stream(tritonclient.grpc, server, requests, **stream_options)
    facade, client = run_stream(tritonshm.grpc, server, requests, **stream_options)
    return plain, facade, client.pools_seen


def assert_through_slots(pools):
    assert pools, "the facade sent the stream's inputs over the wire"
    assert all(pool.running == 0 and pool.held == 0 for pool in pools), "a slot was kept after the stream stopped"


@pytest.mark.parametrize("empty_final", [False, True], ids=["no-empty-final", "empty-final"])
def test_a_decoupled_stream_hears_what_tritonclient_hears(server, empty_final):
    def requests(module):
        return [(("stream_fp32", stream_request(module, count, value=count)),
                 {"request_id": f"r{count}", "enable_empty_final_response": empty_final})
                for count in (3, 0, 1, 2)]

    plain, facade, pools = both_ways(server, requests)
    assert by_request(facade) == by_request(plain)
    assert len(plain) == 6 + (4 if empty_final else 0)
    assert_through_slots(pools)


def test_responses_of_one_request_arrive_in_order_with_its_id_and_none(server):
    """No request_id (tritonclient's default): the responses carry none, as tritonclient's."""
    def requests(module):
        return [(("stream_fp32", stream_request(module, 4, length=100_000)), {})]

    plain, facade, pools = both_ways(server, requests)
    assert facade == plain and len(plain) == 4
    assert_through_slots(pools)


def test_the_model_sees_a_streamed_requests_own_id(server):
    """The server (and the model: echo_request echoes it) sees the caller's request_id, as with
    tritonclient; two requests in flight with one id are still told apart (the second goes under
    an id of the facade's own), each answered under the caller's id."""
    import json

    def seen(module):
        def requests(module):
            x = module.InferInput("INPUT0", [1, 3], "FP32")
            x.set_data_from_numpy(np.ones((1, 3), np.float32))
            return [(("echo_request", [x]), {"request_id": "my-request-7"})] * 2

        answers, _ = run_stream(module, server, requests)
        responses = [tritonclient.grpc.service_pb2.ModelInferResponse.FromString(rest[0]) for _, *rest in answers]
        model_saw = [json.loads(tritonclient.grpc.InferResult(r).as_numpy("OUTPUT0")[0, 0])["request_id"]
                     for r in responses]
        return model_saw[0], [r.id for r in responses]

    expected = seen(tritonclient.grpc)
    assert expected == ("my-request-7", ["my-request-7", "my-request-7"])
    assert seen(tritonshm.grpc) == expected


def test_the_model_sees_an_aio_streamed_requests_own_id(server):
    import json

    async def seen(module):
        client = module.InferenceServerClient(server.grpc_url)
        x = module.InferInput("INPUT0", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32))
        try:
            async def requests():
                yield {"model_name": "echo_request", "inputs": [x], "request_id": "my-request-8"}

            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                return json.loads(result.as_numpy("OUTPUT0")[0, 0])["request_id"], result.get_response().id
        finally:
            await client.close()

    expected = asyncio.run(seen(tritonclient.grpc.aio))
    assert expected == ("my-request-8", "my-request-8")
    assert asyncio.run(seen(tritonshm.grpc.aio)) == expected


def test_errors_on_the_stream_are_tritonclients(server):
    """A model's error response, a missing input: the server's errors, as tritonclient's callback
    hears them, and the stream goes on."""
    def requests(module):
        missing = stream_request(module, 1)[:1]
        return [(("stream_fp32", stream_request(module, -1)), {"request_id": "negative"}),
                (("stream_fp32", missing), {"request_id": "missing"}),
                (("stream_fp32", stream_request(module, 1, value=7.0)), {"request_id": "after"})]

    plain, facade, pools = both_ways(server, requests)
    assert by_request(facade) == by_request(plain)
    assert len(by_request(plain)["errors"]) == 2 and len(by_request(plain)["after"]) == 1
    assert_through_slots(pools)


def test_an_unknown_model_on_the_stream_is_tritonclients_error(server):
    """On a stream of its own: Triton 2.51 aborts (proto_buffer_writer.h "ASSERTION FAILED:
    !byte_buffer->Valid()", SIGABRT) in some 5% of streams where its own error for an unknown model
    is written while a backend's response is, plain tritonclient too -- CI lost its server so."""
    def requests(module):
        return [(("no_such_model", stream_request(module, 1)), {"request_id": "unknown"})]

    plain, facade, _ = both_ways(server, requests)
    assert by_request(facade) == by_request(plain)
    assert len(by_request(plain)["errors"]) == 1


def test_a_model_that_is_not_decoupled_answers_once_per_request(server):
    def requests(module):
        made = []
        for i in range(6):
            inp = module.InferInput("INPUT0", [1000], "FP32")
            inp.set_data_from_numpy(np.arange(1000, dtype=np.float32) + i)
            made.append((("identity_fp32", [inp]), {"request_id": str(i),
                                                    "outputs": [module.InferRequestedOutput("OUTPUT0")]}))
        return made

    plain, facade, pools = both_ways(server, requests)
    assert by_request(facade) == by_request(plain) and len(plain) == 6
    assert_through_slots(pools)


def test_a_sequence_on_the_stream_accumulates_as_with_tritonclient(server):
    def requests(module):
        made = []
        for step, value in enumerate([1.0, 2.0, 4.0]):
            inp = module.InferInput("INPUT0", [1, 3], "FP32")
            inp.set_data_from_numpy(np.full((1, 3), value, np.float32))
            made.append((("accumulate_fp32", [inp]), {"request_id": f"s{step}", "sequence_id": 4301,
                                                      "sequence_start": step == 0, "sequence_end": step == 2}))
        return made

    plain, facade, pools = both_ways(server, requests)
    assert facade == plain and len(plain) == 3
    last = tritonclient.grpc.InferResult(tritonclient.grpc.service_pb2.ModelInferResponse.FromString(facade[-1][1]))
    assert last.as_numpy("OUTPUT0").tolist() == [[7.0, 7.0, 7.0]]
    assert_through_slots(pools)


def test_an_input_bound_by_hand_passes_through_on_the_stream(server):
    """A request the slots do not carry (here: a request whose datatype the model does not take)
    goes on the same stream as tritonclient builds it, in order with the others."""
    def requests(module):
        wrong = module.InferInput("INPUT0", [3], "FP64")
        wrong.set_data_from_numpy(np.ones(3, np.float64))
        count = module.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([1], np.int32))
        return [(("stream_fp32", stream_request(module, 1)), {"request_id": "a"}),
                (("stream_fp32", [wrong, count]), {"request_id": "wrong"}),
                (("stream_fp32", stream_request(module, 2)), {"request_id": "b"})]

    plain, facade, pools = both_ways(server, requests)
    assert by_request(facade) == by_request(plain)
    assert_through_slots(pools)


def test_misuse_raises_as_tritonclient(server):
    for module in (tritonclient.grpc, tritonshm.grpc):
        client = module.InferenceServerClient(server.grpc_url)
        try:
            messages = []
            for call in (lambda: client.async_stream_infer("stream_fp32", stream_request(module, 1)),
                         lambda: client.start_stream(print) or client.start_stream(print),
                         lambda: client.async_stream_infer("stream_fp32", stream_request(module, 1), model_version=1)):
                with pytest.raises(InferenceServerException) as caught:
                    call()
                messages.append(caught.value.message())
            client.stop_stream()
            client.stop_stream()  # twice: nothing to stop, as tritonclient's
        finally:
            client.close()
        if module is tritonclient.grpc:
            expected = messages
    assert messages == expected


def test_stop_stream_with_cancel_requests_tells_the_callback_and_never_reuses_the_slot_the_server_may_read(server):
    answers = []
    done = threading.Event()
    client = tritonshm.grpc.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: (answers.append((result, error)), done.set()))
        inputs = stream_request(tritonshm.grpc, 50, length=1000)
        client.async_stream_infer("stream_fp32", inputs, parameters={"delay_ms": 20})
        assert done.wait(30)
        client.stop_stream(cancel_requests=True)
        errors = [error for _, error in answers if error is not None]
        assert errors and errors[-1].status() == "StatusCode.CANCELLED"
        assert len(answers) < 50
        # The server may still be reading the request's slot (the stream ended before its
        # final response): the slot is kept out of its pool until the server let go of it.
        [pool] = client.tritonshm.pools()
        assert (pool.running, pool.held) == (0, 0) and pool.awaiting_server >= 1
        # A new stream works after it, on another slot.
        again = []
        client.start_stream(lambda result, error: again.append((result, error)))
        client.async_stream_infer("stream_fp32", stream_request(tritonshm.grpc, 2, length=1000))
        client.stop_stream()
        assert [error for _, error in again] == [None, None]
        [pool] = client.tritonshm.pools()
        assert (pool.running, pool.held) == (0, 0)
    finally:
        client.close()


def test_close_waits_for_the_stream_then_releases_the_slots(server):
    answers = []
    client = tritonshm.grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.append((result, error)))
    client.async_stream_infer("stream_fp32", stream_request(tritonshm.grpc, 3), parameters={"delay_ms": 10})
    names = {name for pool in client.tritonshm.pools() for name in pool.regions}
    client.close()  # as tritonclient's: stops the stream, waiting for its requests
    assert len(answers) == 3 and all(error is None for _, error in answers)
    with tritonclient.grpc.InferenceServerClient(server.grpc_url) as other:
        registered = {region.name for region in other.get_system_shared_memory_status().regions.values()}
    assert names and not names & registered


# -- tritonshm.grpc.aio: stream_infer -----------------------------------------------------------


async def run_aio_stream(module, server, requests):
    client = module.InferenceServerClient(server.grpc_url)
    try:
        async def given():
            for kwargs in requests(module):
                yield kwargs

        answers = []
        async for result, error in client.stream_infer(given()):
            answers.append(heard(result, error))
        pools = client.tritonshm.pools() if isinstance(client, tritonshm.grpc.aio.InferenceServerClient) else None
        return answers, pools
    finally:
        await client.close()


def test_aio_stream_infer_hears_what_tritonclient_hears(server):
    def requests(module):
        made = [{"model_name": "stream_fp32", "inputs": stream_request(module, count, value=count),
                 "request_id": f"r{count}"} for count in (2, 0, 3)]
        made.append({"model_name": "stream_fp32", "inputs": stream_request(module, -1), "request_id": "bad"})
        return made

    async def main():
        plain, _ = await run_aio_stream(tritonclient.grpc.aio, server, requests)
        facade, pools = await run_aio_stream(tritonshm.grpc.aio, server, requests)
        return plain, facade, pools

    plain, facade, pools = asyncio.run(main())
    assert by_request(facade) == by_request(plain)
    assert len(plain) == 6
    assert_through_slots(pools)


@pytest.mark.parametrize("given, said", [(["not", "a", "dict"], "inputs_iterator is not yielding a dict"),
                                         ({"inputs": []}, "model_name and/or inputs is missing from "
                                                          "inputs_iterator's yielded dict")])
def test_aio_stream_infer_refuses_what_tritonclient_refuses_with_its_words(server, given, said):
    """tritonclient raises these inside gRPC's request iterator, which cancels the call: its
    caller sees a bare ``asyncio.CancelledError``.  The facade raises tritonclient's own error
    from the iterator instead (its message), after the responses to what came before."""
    async def main():
        client = tritonshm.grpc.aio.InferenceServerClient(server.grpc_url)
        try:
            async def requests():
                yield {"model_name": "stream_fp32", "inputs": stream_request(tritonshm.grpc, 1)}
                yield given

            answers = []
            with pytest.raises(InferenceServerException) as caught:
                async for result, error in client.stream_infer(requests()):
                    answers.append((result, error))
            return answers, caught.value.message()
        finally:
            await client.close()

    answers, message = asyncio.run(main())
    assert message == said
    assert [error for _, error in answers] == [None]
