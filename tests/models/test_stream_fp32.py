"""The bundled decoupled model ``stream_fp32``, driven through plain tritonclient.grpc streaming.

What these tests pin down is also what a client streaming from Triton 2.51 has to know: how the
end of a request shows (the ``triton_final_response`` response parameter; an empty final
response only with ``enable_empty_final_response``), how errors arrive (in the callback, without
the request id -- which the raw stream response still carries), that cancelling the stream
cancels the model's work, that shared-memory inputs work on a stream, and that every response
of one request writes its shared-memory outputs over the previous one's.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import tritonshm
from tritonshm.server import LocalServer
from triton_fixtures import start_or_skip

MODEL = "stream_fp32"


class Stream:
    """A tritonclient.grpc client with its stream started; responses queue up as (result, error)."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.on_response = None  # called in the callback thread, before the response is queued
        self.client.start_stream(self._callback)

    def _callback(self, result, error):
        if self.on_response is not None:
            self.on_response(result, error)
        self.responses.put((result, error))

    def send(self, x, count, request_id="", *, empty_final=True, parameters=None, inputs=None, outputs=None):
        """Stream one request to stream_fp32 (INPUT0 = *x*, COUNT = *count*)."""
        if inputs is None:
            x = np.asarray(x, np.float32)
            i0 = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            i0.set_data_from_numpy(x)
            inputs = [i0]
        i1 = grpcclient.InferInput("COUNT", [1], "INT32")
        i1.set_data_from_numpy(np.array([count], np.int32))
        self.client.async_stream_infer(MODEL, inputs + [i1], request_id=request_id, outputs=outputs,
                                       enable_empty_final_response=empty_final, parameters=parameters)

    def next(self, timeout=10.0):
        return self.responses.get(timeout=timeout)

    def until_final(self, timeout=10.0) -> list:
        """Responses up to and including the next one flagged final (errors included)."""
        got = []
        while True:
            result, error = self.next(timeout)
            got.append((result, error))
            if result is not None and is_final(result):
                return got

    def quiet(self, seconds=0.3) -> bool:
        """True if nothing arrives for *seconds*."""
        try:
            self.responses.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


def test_config_is_decoupled(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config(MODEL).config
        assert config.model_transaction_policy.decoupled
        assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [-1]), ("COUNT", [1])]
        assert [(o.name, list(o.dims)) for o in config.output] == [("OUTPUT0", [-1]), ("INDEX", [1])]
    finally:
        client.close()


@pytest.mark.parametrize("count", [1, 3, 8])
def test_count_responses_then_an_empty_final_one(stream, count):
    x = np.arange(5, dtype=np.float32) / 3
    stream.send(x, count, "r1")
    got = stream.until_final()
    assert [error for _, error in got] == [None] * (count + 1)
    results = [result for result, _ in got]
    for i, result in enumerate(results[:-1]):
        assert result.get_response().id == "r1" and not is_final(result)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + np.float32(i))
        assert result.as_numpy("OUTPUT0").dtype == np.float32
        assert result.as_numpy("INDEX").tolist() == [i]
    last = results[-1]  # the final flag, sent on its own: a response without outputs
    assert last.get_response().id == "r1" and is_final(last) and list(last.get_response().outputs) == []
    assert stream.quiet()


def test_count_zero_sends_only_the_empty_final_response(stream):
    stream.send([1.0], 0, "zero")
    (result, error), = stream.until_final()
    assert error is None and result.get_response().id == "zero" and result.as_numpy("OUTPUT0") is None


def test_without_empty_final_responses_the_end_does_not_show(stream):
    stream.send([1.0], 0, "nothing", empty_final=False)
    stream.send([1.0], 2, "two", empty_final=False)
    got = [stream.next() for _ in range(2)]
    assert [(r.get_response().id, r.as_numpy("INDEX").tolist(), is_final(r)) for r, _ in got] == \
        [("two", [0], False), ("two", [1], False)]  # and nothing says "two" (or "nothing") ended
    assert stream.quiet()


def test_requests_on_one_stream_keep_their_ids(stream):
    stream.send(np.zeros(2), 3, "a", parameters={"delay_ms": 20})
    stream.send(np.ones(2), 2, "b")
    got = stream.until_final() + stream.until_final()
    by_id = {}
    for result, error in got:
        assert error is None
        by_id.setdefault(result.get_response().id, []).append(result)
    assert sorted(by_id) == ["a", "b"]
    assert [r.as_numpy("INDEX").tolist() for r in by_id["a"][:-1]] == [[0], [1], [2]]
    assert [r.as_numpy("OUTPUT0").tolist() for r in by_id["b"][:-1]] == [[1, 1], [2, 2]]
    assert is_final(by_id["a"][-1]) and is_final(by_id["b"][-1])


def test_delay_ms_spaces_the_responses(stream):
    stream.send([0.0], 3, "slow", parameters={"delay_ms": 150})
    times = []
    for _ in range(3):
        stream.next()
        times.append(time.monotonic())
    assert times[2] - times[0] >= 0.28
    assert is_final(stream.next()[0])


def test_nan_gives_an_error_mid_stream(stream):
    stream.send([1.0, np.nan], 3, "nan")
    (first, e0), (none, error), (final, e2) = stream.until_final()
    assert e0 is None and first.as_numpy("INDEX").tolist() == [0]
    assert none is None and "INPUT0 holds a NaN" in str(error)  # tritonclient's callback: no request id
    assert e2 is None and is_final(final) and final.get_response().id == "nan"


def test_nan_with_a_single_response(stream):
    stream.send([np.nan], 1, "nan1")
    (first, e0), (none, error), (final, _) = stream.until_final()
    assert e0 is None and first.as_numpy("INDEX").tolist() == [0] and "NaN" in str(error) and is_final(final)


def test_a_bad_request_gets_one_error_that_is_also_final(stream):
    stream.send([1.0], -1, "neg")
    result, error = stream.next()
    assert result is None and "COUNT must be >= 0, got -1" in str(error)
    assert stream.quiet()  # the error carried the final flag: no empty final response follows
    stream.send([1.0], 1, "neg-delay", parameters={"delay_ms": -5})
    assert "delay_ms must be >= 0" in str(stream.next()[1]) and stream.quiet()


def test_errors_carry_the_request_id_and_final_flag_on_the_wire(server):
    """tritonclient's stream callback gets only the message of an error; the stream response
    itself still names the request and, for a model's errors, says whether it was the last."""
    def request(rid, count, x, model=MODEL, with_count=True):
        r = service_pb2.ModelInferRequest(model_name=model, id=rid)
        r.parameters["triton_enable_empty_final_response"].bool_param = True
        t = r.inputs.add(name="INPUT0", datatype="FP32", shape=[len(x)])
        r.raw_input_contents.append(np.asarray(x, np.float32).tobytes())
        if with_count:
            r.inputs.add(name="COUNT", datatype="INT32", shape=[1])
            r.raw_input_contents.append(np.array([count], np.int32).tobytes())
        assert t.name == "INPUT0"
        return r

    channel = grpc.insecure_channel(server.grpc_url)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        got = []
        # The requests Triton refuses before a model sees them each go on a stream of their own:
        # Triton 2.51 can abort (gRPC "ASSERTION FAILED: !byte_buffer->Valid()") when it refuses
        # a request for an unknown model while another response is written on the same stream,
        # and after such a refusal a request refused for a missing input is never answered.
        for requests in ([request("neg", -1, [1]), request("nan", 2, [np.nan])],
                         [request("no-count", 1, [1], with_count=False)], [request("no-model", 1, [1], model="nope")]):
            got += [(r.infer_response.id, r.error_message, dict(r.infer_response.parameters))
                    for r in stub.ModelStreamInfer(iter(requests), timeout=30)]
    finally:
        channel.close()
    final = {rid: [p["triton_final_response"].bool_param if "triton_final_response" in p else None
                   for _, _, p in [g for g in got if g[0] == rid]] for rid, _, _ in got}
    errors = {rid: message for rid, message, _ in got if message}
    assert errors["neg"] == "COUNT must be >= 0, got -1" and final["neg"] == [True]
    assert "NaN" in errors["nan"] and final["nan"] == [False, False, True]  # response, error, final
    # refused before the model ran: the id (and the id in the message), no final flag at all
    assert "[request id: no-count] expected 2 inputs but got 1" in errors["no-count"]
    assert final["no-count"] == [None]
    assert "Request for unknown model: 'nope' is not found" in errors["no-model"] and final["no-model"] == [None]


@pytest.fixture(scope="module")
def own_server():
    """A server of this module's own with only stream_fp32: Triton before 2.57 has races in gRPC
    cancellation (server issues 7368, 8034) that can take the server down; the session's is spared."""
    srv = LocalServer(quiet=True, extra_args=["--model-control-mode=explicit", f"--load-model={MODEL}"])
    with start_or_skip(srv):
        from triton_fixtures import _warm_up_tritonclient

        _warm_up_tritonclient(srv.http_url, srv.grpc_url)
        yield srv


@pytest.mark.server
def test_cancelling_the_stream_cancels_the_models_work(own_server):
    server = own_server
    s = Stream(server.grpc_url)
    try:
        s.send([0.0], 20, "long", parameters={"delay_ms": 200})  # 4 s unless cancelled
        assert s.next()[0].as_numpy("INDEX").tolist() == [0]
    finally:
        s.close(cancel=True)
    errors = []
    while True:
        try:
            result, error = s.responses.get(timeout=0.5)
        except queue.Empty:
            break
        if error is not None:
            errors.append(error)
    assert len(errors) == 1 and errors[0].status() == "StatusCode.CANCELLED"
    # the model noticed (request.is_cancelled()) and stopped: its one instance serves at once
    s = Stream(server.grpc_url)
    try:
        t0 = time.monotonic()
        s.send([1.0], 1, "after")
        assert [r.get_response().id for r, _ in s.until_final()] == ["after", "after"]
        assert time.monotonic() - t0 < 1.5
    finally:
        s.close()


def test_unary_inference_is_refused(server):
    x = np.zeros(2, np.float32)
    for module, url in ((grpcclient, server.grpc_url), (httpclient, server.http_url)):
        client = module.InferenceServerClient(url)
        try:
            i0 = module.InferInput("INPUT0", [2], "FP32")
            i0.set_data_from_numpy(x)
            i1 = module.InferInput("COUNT", [1], "INT32")
            i1.set_data_from_numpy(np.array([1], np.int32))
            with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
                client.infer(MODEL, [i0, i1])
        finally:
            client.close()


def test_a_plain_model_on_a_stream_answers_once_and_final(stream):
    i0 = grpcclient.InferInput("INPUT0", [3], "FP32")
    i0.set_data_from_numpy(np.arange(3, dtype=np.float32))
    stream.client.async_stream_infer("identity_fp32", [i0], request_id="plain", enable_empty_final_response=True)
    (result, error), = stream.until_final()
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [0, 1, 2] and is_final(result)


# -- shared memory on a stream --------------------------------------------------------------


@pytest.fixture
def regions(server):
    """An input and an output SystemRegion registered with the server (gRPC client), unregistered after."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rin, rout = tritonshm.SystemRegion.create(4096), tritonshm.SystemRegion.create(4096)
    names = [tritonshm.register(client, rin), tritonshm.register(client, rout)]
    try:
        yield rin, rout
    finally:
        for name in names:
            tritonshm.unregister(client, name)
        client.close()
        rin.close()
        rout.close()


def _bound(rin, rout, n):
    i0 = grpcclient.InferInput("INPUT0", [n], "FP32")
    tritonshm.bind_input(i0, rin, 0, n * 4)
    o0 = grpcclient.InferRequestedOutput("OUTPUT0")
    tritonshm.bind_output(o0, rout, 0, n * 4)
    return [i0], [o0, grpcclient.InferRequestedOutput("INDEX")]


def test_shared_memory_input_and_output_on_a_stream(stream, regions):
    rin, rout = regions
    n = 6
    rin.write(np.arange(n, dtype=np.float32))
    read = []
    stream.on_response = lambda result, error: read.append(rout.read(np.float32, (n,)))  # at once, in the callback
    inputs, outputs = _bound(rin, rout, n)
    stream.send(None, 3, "shm", inputs=inputs, outputs=outputs, parameters={"delay_ms": 100})
    got = stream.until_final()
    for i, (result, error) in enumerate(got[:-1]):
        assert error is None and result.as_numpy("INDEX").tolist() == [i]
        assert list(result.get_response().raw_output_contents)[0] == b""  # OUTPUT0's data is in the region
        np.testing.assert_array_equal(read[i], np.arange(n, dtype=np.float32) + i)
    assert is_final(got[-1][0])


def test_each_response_overwrites_the_shared_memory_output(stream, regions):
    """The server writes every response of a request into the same bytes and does not wait for
    the client: a callback that reads late reads a later response's data."""
    rin, rout = regions
    n = 4
    rin.write(np.zeros(n, dtype=np.float32))
    first = threading.Event()
    read = []

    def slow_consumer(result, error):
        if not first.is_set():
            first.set()
            time.sleep(1.0)  # responses 1 to 3 are written meanwhile
        read.append(rout.read(np.float32, (n,)))

    stream.on_response = slow_consumer
    inputs, outputs = _bound(rin, rout, n)
    stream.send(None, 4, "late", inputs=inputs, outputs=outputs)
    got = stream.until_final()
    assert [r.as_numpy("INDEX").tolist() for r, _ in got[:-1]] == [[0], [1], [2], [3]]
    assert [a.tolist() for a in read[:4]] == [[3.0] * n] * 4  # response 0's callback saw response 3's data
