"""Client.stream and aio.Client.stream against the real Triton: decoupled and sequence models.

``stream_fp32`` answers one request with COUNT responses (OUTPUT0 = INPUT0 + i, INDEX = i),
``accumulate_fp32`` keeps a running sum per sequence, ``echo_request`` says what the server saw.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import numpy as np
import pytest

import tritonshm
from triton_fixtures import start_or_skip

pytestmark = pytest.mark.server


def counts(n: int) -> np.ndarray:
    return np.array([n], dtype=np.int32)


def check_responses(responses, x, n):
    assert [int(r["INDEX"][0]) for r in responses] == list(range(n))
    for i, response in enumerate(responses):
        np.testing.assert_array_equal(response["OUTPUT0"], x + i)


def wait_until_idle(client, seconds=10.0):
    """The slots of streams whose requests the server is finishing come back by themselves."""
    deadline = time.monotonic() + seconds
    while any(p.running for p in client.pools()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p.running for p in client.pools()]


@pytest.fixture
def client(server):
    with tritonshm.Client(server.grpc_url) as c:
        yield c


def test_a_decoupled_model_streams_every_response_in_order(client):
    x = np.linspace(0, 1, 32, dtype=np.float32)
    responses = list(client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(6)}))
    check_responses(responses, x, 6)
    (pool,) = client.pools()
    assert pool.memory == "system" and pool.running == 0  # the inputs went through a slot, which is back


def test_no_responses_at_all_is_an_empty_stream(client):
    assert list(client.stream("stream_fp32", {"INPUT0": np.ones(4, np.float32), "COUNT": counts(0)})) == []
    assert wait_until_idle(client) == [0]


def test_a_model_that_is_not_decoupled_streams_one_response(client):
    x = np.arange(16, dtype=np.float32)
    (response,) = client.stream("identity_fp32", {"INPUT0": x})
    np.testing.assert_array_equal(response["OUTPUT0"], x)


def test_the_request_is_sent_when_stream_returns(client):
    """The inputs are copied into the slot at the call: changing the array afterwards changes nothing."""
    x = np.zeros(8, np.float32)
    responses = client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(2)})
    x[:] = 99
    check_responses(list(responses), np.zeros(8, np.float32), 2)


def test_many_concurrent_streams_on_one_client(client):
    def one(k):
        x = np.full(64, k, np.float32)
        n = k % 5 + 1
        check_responses(list(client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(n)})), x, n)
        return n

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(one, range(40))) == sum(k % 5 + 1 for k in range(40))
    # Several open at once on one thread, read in any order.
    streams = [(k, client.stream("stream_fp32", {"INPUT0": np.full(4, k, np.float32), "COUNT": counts(3)}))
               for k in range(4)]
    for k, responses in reversed(streams):
        check_responses(list(responses), np.full(4, k, np.float32), 3)
    assert wait_until_idle(client) == [0]


def test_closing_a_stream_early_gives_the_slot_back_once_the_server_is_done(client):
    x = np.ones(8, np.float32)
    responses = client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(10)}, parameters={"delay_ms": 30})
    first = next(responses)
    np.testing.assert_array_equal(first["OUTPUT0"], x)
    responses.close()
    (pool,) = client.pools()
    assert pool.running == 1  # the server still runs the request: it may read the inputs
    assert wait_until_idle(client) == [0]
    # The stream serves the next request as usual.
    check_responses(list(client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(2)})), x, 2)


def test_an_error_mid_stream_raises_after_the_responses_before_it(client):
    x = np.array([1.0, np.nan], np.float32)
    responses = client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(3)})
    first = next(responses)
    assert int(first["INDEX"][0]) == 0
    with pytest.raises(tritonshm.ServerError, match="NaN"):
        next(responses)
    assert wait_until_idle(client) == [0]


def test_client_timeout_bounds_the_wait_for_each_response(client):
    responses = client.stream("stream_fp32", {"INPUT0": np.ones(2, np.float32), "COUNT": counts(2)},
                              parameters={"delay_ms": 1500}, client_timeout=0.2)
    next(responses)  # the first comes at once
    with pytest.raises(tritonshm.ServerTimeout, match="client_timeout=0.2"):
        next(responses)
    assert wait_until_idle(client) == [0]  # held until the server finished the request


def test_bad_requests_and_options_are_refused_before_anything_is_sent(server, client):
    x = np.ones(4, np.float32)
    with pytest.raises(tritonshm.DTypeMismatch):
        client.stream("stream_fp32", {"INPUT0": x.astype(np.float64), "COUNT": counts(1)})
    with pytest.raises(tritonshm.InvalidOption, match="priority"):
        client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1)}, priority=-1)
    with pytest.raises(tritonshm.InvalidOptionType, match="colour"):
        client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1)}, colour="red")
    with pytest.raises(tritonshm.InvalidOption, match="sequence_id"):
        client.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1)}, sequence_start=True)
    with pytest.raises(tritonshm.ShapeMismatch, match="max_batch_size=8"):
        client.stream("batched_fp32", {"INPUT0": np.ones((9, 4), np.float32)})
    assert wait_until_idle(client) == [0] * len(client.pools())
    with tritonshm.Client("http://" + server.http_url) as http:
        with pytest.raises(tritonshm.InvalidOption, match="gRPC"):
            http.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1)})


def test_a_decoupled_model_is_refused_by_infer_and_request_with_a_pointer_to_stream(client):
    inputs = {"INPUT0": np.ones(2, np.float32), "COUNT": counts(1)}
    with pytest.raises(tritonshm.InvalidOption, match="decoupled.*stream"):
        client.infer("stream_fp32", inputs)
    with pytest.raises(tritonshm.InvalidOption, match="decoupled.*stream"):
        client.request("stream_fp32")
    assert client.pools() == []


def test_closing_the_client_lets_the_server_finish_short_streams(server):
    c = tritonshm.Client(server.grpc_url)
    x = np.ones(4, np.float32)
    responses = c.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(3)}, parameters={"delay_ms": 100})
    (name,) = c.pools()[0].regions
    c.close()  # half-closes the stream: the server finishes what it runs (within a grace period)
    check_responses(list(responses), x, 3)
    with tritonshm.Client(server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)


def test_closing_the_client_ends_long_streams_with_client_closed(fresh_server):
    c = tritonshm.Client(fresh_server.grpc_url)
    responses = c.stream("stream_fp32", {"INPUT0": np.ones(4, np.float32), "COUNT": counts(1000)},
                         parameters={"delay_ms": 20})
    next(responses)
    (name,) = c.pools()[0].regions
    c.close()
    with pytest.raises(tritonshm.ClientClosed):
        list(responses)
    with tritonshm.Client(fresh_server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)


def test_a_stream_survives_a_server_restart():
    """Mid-stream the server goes: a clear error, the slot back; after the restart the
    stream is opened again and our regions registered again."""
    with start_or_skip(tritonshm.server.LocalServer()) as srv:
        with tritonshm.Client(srv.grpc_url) as c:
            x = np.ones(4, np.float32)
            check_responses(list(c.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1)})), x, 1)
            responses = c.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(1000)}, parameters={"delay_ms": 50})
            next(responses)
            srv.stop(grace=0)  # killed: no orderly end of what it runs
            with pytest.raises(tritonshm.ServerUnavailable):
                list(responses)
            srv.start()
            assert wait_until_idle(c) == [0]
            check_responses(list(c.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(3)})), x, 3)


# -- sequences ---------------------------------------------------------------------------------


def test_a_sequence_keeps_its_state_through_infer(client):
    x = np.arange(4, dtype=np.float32)
    got = [client.infer("accumulate_fp32", {"INPUT0": x[None] * (k + 1)}, sequence_id=101,
                        sequence_start=k == 0, sequence_end=k == 3)["OUTPUT0"] for k in range(4)]
    for k, out in enumerate(got):
        np.testing.assert_array_equal(out, x[None] * sum(range(1, k + 2)))


def test_two_sequences_interleaved_with_string_ids_over_the_stream(client):
    x = np.ones((1, 3), np.float32)
    totals = {"alice": 0.0, "bob": 0.0}
    for k in range(6):
        who = "alice" if k % 2 == 0 else "bob"
        step = 1.0 if who == "alice" else 10.0
        totals[who] += step
        (response,) = client.stream("accumulate_fp32", {"INPUT0": x * step}, sequence_id=f"chat-{who}",
                                    sequence_start=k < 2, sequence_end=k >= 4)
        np.testing.assert_array_equal(response["OUTPUT0"], x * totals[who])


def test_a_zero_copy_request_runs_in_a_sequence(client):
    with client.request("accumulate_fp32", batch_size=1, shapes={"INPUT0": (1, 2)}) as req:
        req.inputs["INPUT0"][:] = 2.0
        first = req.run(sequence_id=77, sequence_start=True)["OUTPUT0"].copy()
        second = req.run(sequence_id=77, sequence_end=True)["OUTPUT0"].copy()
    np.testing.assert_array_equal(first, [[2.0, 2.0]])
    np.testing.assert_array_equal(second, [[4.0, 4.0]])


# -- options reach the server ------------------------------------------------------------------


def echo(result) -> dict:
    return json.loads(result["OUTPUT0"][0, 0])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_every_option_reaches_the_server(server, protocol):
    url = server.grpc_url if protocol == "grpc" else "http://" + server.http_url
    x = np.ones((1, 3), np.float32)
    with tritonshm.Client(url) as c:
        seen = echo(c.infer("echo_request", {"INPUT0": x}, parameters={"temperature": 0.5, "tag": "a"},
                            priority=1, timeout=30_000_000, sequence_id=9, sequence_start=True))
        assert seen["parameters"] == {"temperature": 0.5, "tag": "a"}
        assert seen["timeout"] == 30_000_000 and seen["correlation_id"] == 9 and seen["flags"] == 1
        plain = echo(c.infer("echo_request", {"INPUT0": x}))
        assert (plain["parameters"], plain["correlation_id"], plain["flags"]) == ({}, 0, 0)
        opts = tritonshm.RequestOptions(parameters={"p": 1}, sequence_id="s-1", sequence_end=True)
        seen = echo(c.infer_async("echo_request", {"INPUT0": x}, options=opts).result())
        assert seen["parameters"] == {"p": 1} and seen["correlation_id"] == "s-1" and seen["flags"] == 2
        if protocol == "grpc":
            (response,) = c.stream("echo_request", {"INPUT0": x}, parameters={"via": "stream"}, priority=1)
            assert echo(response)["parameters"] == {"via": "stream"}


def test_a_server_timeout_that_passes_in_the_queue_is_the_servers_error(client):
    """timeout is tritonclient's: the server's, in microseconds in the queue (not the wait for a slot)."""
    x = np.ones((1, 3), np.float32)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(client.infer, "echo_request", {"INPUT0": x}, parameters={"delay_ms": 600})
        time.sleep(0.2)
        with pytest.raises(tritonshm.ServerError, match="(?i)timeout"):
            client.infer("echo_request", {"INPUT0": x}, timeout=1000)
        busy.result()


# -- asyncio -----------------------------------------------------------------------------------


def test_aio_streams_concurrently_and_cancels(server):
    async def main():
        async with tritonshm.aio.Client(server.grpc_url) as c:
            async def one(k):
                x = np.full(8, k, np.float32)
                got = [r async for r in c.stream("stream_fp32", {"INPUT0": x, "COUNT": counts(k % 4 + 1)})]
                check_responses(got, x, k % 4 + 1)

            await asyncio.gather(*(one(k) for k in range(30)))

            async def read_forever():
                async for _ in c.stream("stream_fp32", {"INPUT0": np.ones(2, np.float32), "COUNT": counts(50)},
                                        parameters={"delay_ms": 20}):
                    pass

            task = asyncio.ensure_future(read_forever())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.monotonic() + 10
            while any(p.running for p in c.pools()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert [p.running for p in c.pools()] == [0]

            seen = echo(await c.infer("echo_request", {"INPUT0": np.ones((1, 2), np.float32)},
                                      parameters={"k": True}, sequence_id=5, sequence_start=True))
            assert seen["parameters"] == {"k": True} and seen["correlation_id"] == 5
            got = [r async for r in c.stream("accumulate_fp32", {"INPUT0": np.ones((1, 2), np.float32)},
                                             sequence_id=6, sequence_start=True, sequence_end=True)]
            np.testing.assert_array_equal(got[0]["OUTPUT0"], [[1.0, 1.0]])

    asyncio.run(main())


# -- GPU inputs (the fake CUDA runtime; real GPUs: tests/client/test_client_cuda_gpu.py) --------


def test_a_device_input_streams_through_a_cuda_slot(fake_cuda_server, fake_cuda):
    from test_client_cuda import device_array
    from tritonshm import cuda

    x = np.linspace(0, 1, 16, dtype=np.float32)
    with tritonshm.Client(fake_cuda_server.grpc_url) as c:
        responses = list(c.stream("stream_fp32", {"INPUT0": device_array(x), "COUNT": counts(3)}))
        assert [int(r["INDEX"].get()[0]) for r in responses] == [0, 1, 2]
        for i, response in enumerate(responses):
            assert isinstance(response["OUTPUT0"], cuda.CudaArray)  # results land where the inputs were
            np.testing.assert_array_equal(response["OUTPUT0"].get(), x + i)
        (pool,) = c.pools()
        assert pool.memory == "cuda:0" and pool.running == 0
        del responses


def test_aio_close_ends_long_streams_with_client_closed(fresh_server):
    async def main():
        c = tritonshm.aio.Client(fresh_server.grpc_url)
        responses = c.stream("stream_fp32", {"INPUT0": np.ones(4, np.float32), "COUNT": counts(1000)},
                             parameters={"delay_ms": 20})
        await responses.__anext__()
        (name,) = c.pools()[0].regions
        await c.close()
        with pytest.raises(tritonshm.ClientClosed):
            async for _ in responses:
                pass
        return name

    name = asyncio.run(main())
    with tritonshm.Client(fresh_server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)
