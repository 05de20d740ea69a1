"""tritonshm._http1: the response reader without sockets, the two drivers against a scripted
local server, and both clients against a real Triton (requests made ready ahead go on the
caller's socket, and what Triton answers means the same as through tritonclient)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
import time

import numpy as np
import pytest

import tritonshm
from tritonshm import _http1
from tritonshm.errors import (ClientClosed, OutputTooSmall, RegionNotRegistered, ServerError, ServerTimeout,
                              ServerUnavailable)

OK_BODY = json.dumps({"model_name": "m", "model_version": "1",
                      "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 3]}]}).encode()


def answer(body: bytes = OK_BODY, status: str = "200 OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


# -- the reader, sans I/O ----------------------------------------------------------


def test_a_whole_response_in_one_feed():
    response = _http1.ResponseReader().feed(answer())
    assert response == _http1.Response(200, {"content-type": "application/json",
                                              "content-length": str(len(OK_BODY))}, OK_BODY, True)


def test_a_response_fed_byte_by_byte_is_complete_only_at_its_last_byte():
    data, reader = answer(), _http1.ResponseReader()
    for i in range(len(data) - 1):
        assert reader.feed(data[i:i + 1]) is None
        assert reader.started
    assert reader.feed(data[-1:]).body == OK_BODY


def test_a_chunked_body_split_anywhere():
    chunks = OK_BODY[:10], OK_BODY[10:50], OK_BODY[50:]
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        f"{len(c):x};ext=1\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    for cut in range(1, len(data)):
        reader = _http1.ResponseReader()
        first = reader.feed(data[:cut])
        response = first if first is not None else reader.feed(data[cut:])
        assert response is not None and response.body == OK_BODY and response.keep_alive


@pytest.mark.parametrize("head, keep_alive", [
    ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2", False),
    ("HTTP/1.0 200 OK\r\nContent-Length: 2", False),
    ("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2", True),
    ("HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2", True),
])
def test_whether_the_connection_may_carry_another_request(head, keep_alive):
    assert _http1.ResponseReader().feed(head.encode() + b"\r\n\r\n{}").keep_alive is keep_alive


def test_a_body_without_a_length_runs_to_the_end_of_the_connection():
    reader = _http1.ResponseReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\n{\"outputs\"") is None
    assert reader.feed(b": []}") is None
    response = reader.eof()
    assert response.body == b'{"outputs": []}' and not response.keep_alive


def test_the_end_of_the_connection_before_or_inside_an_answer():
    assert _http1.ResponseReader().eof() is None  # nothing came: the caller decides
    reader = _http1.ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
    with pytest.raises(ValueError, match="middle"):
        reader.eof()


@pytest.mark.parametrize("data", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
                                  b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n"])
def test_what_is_not_an_http_response_is_refused(data):
    with pytest.raises(ValueError):
        _http1.ResponseReader().feed(data)


def feed_all(data: bytes, cut: int | None = None):
    """*data* fed whole, or in two reads cut at *cut*: the response, or None."""
    reader = _http1.ResponseReader()
    if cut is None:
        return reader.feed(data)
    return reader.feed(data[:cut]) or reader.feed(data[cut:])


def test_interim_answers_are_skipped_and_the_final_one_read():
    data = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
            + answer(b"{}"))
    for cut in [None, *range(1, len(data))]:
        response = feed_all(data, cut)
        assert response is not None and (response.status, response.body, response.keep_alive) == (200, b"{}", True)
        assert "link" not in response.headers
    reader = _http1.ResponseReader()
    assert reader.feed(b"HTTP/1.1 100 Continue\r\n\r\n") is None
    assert reader.started  # the server had the request: never sent again
    assert reader.eof() is None  # closed after the interim answer: no answer
    with pytest.raises(ValueError, match="101"):
        _http1.ResponseReader().feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")


@pytest.mark.parametrize("lengths", [("5", "6"), ("5, 6",), ("5,5", "6"), ("5", "")])
def test_conflicting_content_lengths_are_refused(lengths):
    extra = "".join(f"Content-Length: {length}\r\n" for length in lengths)
    with pytest.raises(ValueError, match="Content-Length"):
        _http1.ResponseReader().feed(f"HTTP/1.1 200 OK\r\n{extra}\r\n12345".encode())


@pytest.mark.parametrize("lengths", [("5", "5"), ("5, 5",), ("5 ,5", "5")])
def test_the_same_content_length_given_twice_is_one(lengths):
    extra = "".join(f"Content-Length: {length}\r\n" for length in lengths)
    response = _http1.ResponseReader().feed(f"HTTP/1.1 200 OK\r\n{extra}\r\n12345".encode())
    assert response.body == b"12345" and response.keep_alive


@pytest.mark.parametrize("value", [b"1_0", b"+5", b"1 0", b"0x5", b"5.0", b"\xb2", b"", b"-1", b"1" * 21])
def test_a_content_length_is_ascii_digits_only(value):
    with pytest.raises(ValueError, match="Content-Length"):
        _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n" + b"x" * 10)


@pytest.mark.parametrize("head", [
    "Transfer-Encoding: gzip", "Transfer-Encoding: gzip, chunked", "Transfer-Encoding: chunked, chunked",
    "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", "Transfer-Encoding: identity",
    "Transfer-Encoding: chunked\r\nContent-Length: 3",
])
def test_transfer_encodings_but_one_chunked_are_refused(head):
    with pytest.raises(ValueError, match="Transfer-Encoding"):
        _http1.ResponseReader().feed(f"HTTP/1.1 200 OK\r\n{head}\r\n\r\n3\r\nabc\r\n0\r\n\r\n".encode())
    with pytest.raises(ValueError, match="HTTP/1.0"):
        _http1.ResponseReader().feed(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    response = _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n")
    assert response.body == b"" and response.keep_alive


def test_headers_given_twice_are_one_list_never_last_wins():
    head = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nX-A: 1\r\nConnection: close\r\nX-A: 2\r\nContent-Length: 0"
    response = _http1.ResponseReader().feed(head + b"\r\n\r\n")
    assert not response.keep_alive and response.headers["x-a"] == "1, 2"
    # Connection options are tokens, not substrings
    assert _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nConnection: x-closed\r\nContent-Length: 0\r\n\r\n"
                                        ).keep_alive


@pytest.mark.parametrize("data", [
    answer(b"{}") + b"HTTP/1.1 200 OK\r\n",                                    # a second answer nobody asked for
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nx",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n{}",                 # 204 has no body, whatever it says
])
def test_bytes_past_the_body_leave_the_connection_out_of_the_pool(data):
    response = _http1.ResponseReader().feed(data)
    assert response.body in (b"{}", b"") and not response.keep_alive
    reader = _http1.ResponseReader()  # the same, the body over two reads
    response = reader.feed(data[:len(data) // 2 + 3]) or reader.feed(data[len(data) // 2 + 3:])
    assert not response.keep_alive


@pytest.mark.parametrize("size", [b"-1", b"zz", b"", b"0x1a", b"1_0", b"+1", b" 1", b"1" * 17, b"1\n", b"1 ;x",
                                  b"1\r-"])
def test_a_bad_chunk_size_is_refused_at_once(size):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(ValueError, match="chunk size"):
        _http1.ResponseReader().feed(head + size + b"\r\nx\r\n0\r\n\r\n")
    if size and size not in (b"1" * 17,):  # a bad first byte: refused before the line ends
        reader = _http1.ResponseReader()
        assert reader.feed(head) is None
        with pytest.raises(ValueError, match="chunk size"):
            for i in range(len(size)):
                reader.feed(size[i:i + 1])


def test_chunks_their_crlf_and_trailers():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(ValueError, match="CRLF"):
        _http1.ResponseReader().feed(head + b"2\r\n{}XX0\r\n\r\n")
    data = head + b"2;name=\"v\"\r\n{}\r\nA \r\n0123456789\r\n0\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n"
    for cut in range(1, len(data)):
        response = feed_all(data, cut)
        assert response is not None and response.body == b"{}0123456789" and response.keep_alive, cut
    reader = _http1.ResponseReader()
    assert reader.feed(data[:-2]) is None  # the trailers' empty line is not in yet
    for trailer in (b"bad trailer\r\n", b"Content-Length: 5\r\n", b"X-A: 1\x00\r\n"):
        with pytest.raises(ValueError, match="trailer"):
            _http1.ResponseReader().feed(head + b"0\r\n" + trailer + b"\r\n")


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nName : value\r\n\r\n", b"HTTP/1.1 200 OK\r\nA: 1\r\n folded\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: a\x01b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\nb\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 099 Low\r\n\r\n",
    b"HTTP/1.2 200 OK\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"HTTP/1.1  200 OK\r\n\r\n", b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n: empty name\r\n\r\n",
])
def test_a_head_off_the_grammar_is_refused(data):
    with pytest.raises(ValueError):
        _http1.ResponseReader().feed(data)


def test_a_refused_head_or_trailer_is_named_by_its_line():
    with pytest.raises(ValueError, match="malformed response header: 'Bad line'"):
        _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nA: 1\r\nBad line\r\nB: 2\r\n\r\n")
    with pytest.raises(ValueError, match="malformed response header: 'HTTP/1.1 200 OK'"):
        _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nHTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(ValueError, match="not an HTTP/1.x status line: 'HTTP/1.1 2x0 OK'"):
        _http1.ResponseReader().feed(b"HTTP/1.1 2x0 OK\r\nA: 1\r\n\r\n")
    with pytest.raises(ValueError, match=re.escape(r"malformed trailer field: 'X-A: 1\x00'")):
        _http1.ResponseReader().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"0\r\nB: 2\r\nX-A: 1\x00\r\n\r\n")


def test_what_cannot_be_an_answer_is_refused_before_a_whole_head():
    reader = _http1.ResponseReader()
    assert reader.feed(b"HTT") is None
    with pytest.raises(ValueError, match="not an HTTP/1.x response"):
        reader.feed(b"X/1.1 200")


def test_each_response_has_headers_of_its_own():
    first = _http1.ResponseReader().feed(answer())
    first.headers["content-type"] = "changed"
    assert _http1.ResponseReader().feed(answer()).headers["content-type"] == "application/json"


def test_a_result_reads_its_outputs():
    result = _http1.result_of(_http1.ResponseReader().feed(answer()), "inferring")
    assert result.get_output("OUTPUT0")["shape"] == [2, 3]
    assert result.get_output("nope") is None
    assert result.get_response()["model_name"] == "m"


@pytest.mark.parametrize("message, error", [
    ("Unable to find shared memory region: 'tshm-1'", RegionNotRegistered),
    ("shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least "
     "16 bytes to hold the results", OutputTooSmall),
    ("Request for unknown model: 'm' is not found", ServerError),
])
def test_an_error_answer_means_what_it_means_through_tritonclient(message, error):
    response = _http1.ResponseReader().feed(answer(json.dumps({"error": message}).encode(), "400 Bad Request"))
    with pytest.raises(error) as info:
        _http1.result_of(response, "inferring with model 'm'")
    assert str(info.value).startswith("inferring with model 'm'")


def test_an_answer_that_is_not_json_says_its_status():
    response = _http1.ResponseReader().feed(answer(b"<html>bad gateway</html>", "502 Bad Gateway"))
    with pytest.raises(ServerError, match="HTTP 502"):
        _http1.result_of(response, "inferring")


def test_a_prepared_request_is_what_tritonclient_would_send():
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    tensor.set_shared_memory("tshm-a", 24, offset=64)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    output.set_shared_memory("tshm-a", 24, offset=128)
    prepared = _http1.prepare("my model", "2", [tensor], [output])
    assert prepared.target == "/v2/models/my%20model/versions/2/infer"
    body = json.loads(prepared.body)
    assert body["inputs"][0]["parameters"] == {"shared_memory_region": "tshm-a", "shared_memory_byte_size": 24,
                                               "shared_memory_offset": 64}
    assert body["outputs"][0]["parameters"]["shared_memory_offset"] == 128
    (wire,) = prepared.wire(b"h:1")  # small: head and body in one write
    assert wire.startswith(b"POST /v2/models/my%20model/versions/2/infer HTTP/1.1\r\nHost: h:1\r\n")
    assert wire.endswith(b"\r\n\r\n" + prepared.body) and f"Content-Length: {len(prepared.body)}".encode() in wire


def test_a_request_with_options_and_tensors_in_it_is_what_tritonclient_would_send():
    import gzip

    import tritonclient.http as httpclient

    values = np.random.default_rng(0).random(1 << 15, dtype=np.float32)  # 128 KiB, hardly compressible
    tensor = httpclient.InferInput("INPUT0", [1 << 15], "FP32")
    tensor.set_data_from_numpy(values, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    prepared = _http1.prepare("m", "", [tensor], [output], {
        "parameters": {"k": "v"}, "priority": 2, "sequence_id": 7, "sequence_start": True, "headers": {"x-a": "b"},
        "request_compression_algorithm": "gzip", "response_compression_algorithm": "deflate"})
    assert prepared.headers["x-a"] == "b" and prepared.headers["Content-Encoding"] == "gzip"
    assert prepared.headers["Accept-Encoding"] == "deflate"
    body = gzip.decompress(prepared.body)
    json_size = prepared.headers["Inference-Header-Content-Length"]
    header = json.loads(body[:json_size])
    assert header["parameters"] == {"sequence_id": 7, "sequence_start": True, "sequence_end": False, "priority": 2,
                                    "k": "v"}
    assert np.array_equal(np.frombuffer(body[json_size:], np.float32), values)
    head, rest = prepared.wire(b"h:1")  # large: the body is not copied into the head
    assert rest is prepared.body and b"x-a: b\r\n" in head and head.endswith(b"\r\n\r\n")
    assert not prepared.idempotent  # in a sequence: never sent twice
    with pytest.raises(TypeError, match="client_timeout"):
        _http1.prepare("m", "", [tensor], [output], {"client_timeout": 1.0})
    with pytest.raises(ValueError, match="line breaks"):
        _http1.Prepared("m", "/", b"", {"x-a": "b\r\nHost: evil"})


@pytest.mark.parametrize("options, idempotent, expected", [
    (None, None, True), ({"sequence_id": 0}, None, True), ({"sequence_id": ""}, None, True),
    ({"sequence_id": 5}, None, False), ({"sequence_id": "s"}, None, False), (None, False, False),
    (None, True, True), ({"sequence_id": 5}, True, False),  # a sequence's step: never, whatever it says
])
def test_whether_a_prepared_request_may_be_sent_twice(options, idempotent, expected):
    assert _http1.prepare("m", "", [], [], options, idempotent).idempotent is expected
    assert _http1.Prepared("m", "/", b"").idempotent  # made by hand: as tritonclient.http's infer has it


def test_an_answer_with_tensors_or_compressed_is_read_by_tritonclients_infer_result():
    import zlib

    values = np.arange(6, dtype=np.float32)
    header = json.dumps({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 3],
                                      "parameters": {"binary_data_size": 24}}]}).encode()
    body = zlib.compress(header + values.tobytes())
    response = _http1.ResponseReader().feed(answer(body, extra=f"Inference-Header-Content-Length: {len(header)}\r\n"
                                                             f"Content-Encoding: deflate\r\n"))
    result = _http1.result_of(response, "inferring")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values.reshape(2, 3))
    error = _http1.ResponseReader().feed(answer(zlib.compress(b'{"error": "Unable to find shared memory region: x"}'),
                                                "400 Bad Request", "Content-Encoding: deflate\r\n"))
    with pytest.raises(RegionNotRegistered):
        _http1.result_of(error, "inferring")
    # the JSON's length is framing too: ASCII digits only (int() would read '1_2' as 12)
    odd_length = f"{len(header) // 10}_{len(header) % 10}"
    odd = _http1.ResponseReader().feed(answer(header + values.tobytes(),
                                              extra=f"Inference-Header-Content-Length: {odd_length}\r\n"))
    with pytest.raises(ServerError, match="malformed Inference-Header-Content-Length"):
        _http1.result_of(odd, "inferring")


def test_a_large_body_read_in_many_pieces_and_how_much_to_ask_for():
    body = bytes(range(256)) * (1 << 14)  # 4 MiB
    data = answer(body)
    reader = _http1.ResponseReader()
    assert reader.wanted() == 64 << 10
    assert reader.feed(data[:100]) is None
    assert reader.wanted() == len(body) - (100 - (len(data) - len(body)))
    response = None
    for at in range(100, len(data), 1 << 16):
        response = reader.feed(data[at:at + (1 << 16)])
    assert response is not None and response.body == body


# -- the drivers, against a scripted server ------------------------------------------


class ScriptedServer:
    """A local TCP server: each connection accepted runs ``script(conn, requests)`` in a thread,
    where *requests* yields each request read (head and body) from it."""

    def __init__(self, script):
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.closed = 0  # connections the server closed
        self.requests: list[bytes] = []
        self._threads = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn):
        with conn:
            try:
                self.script(conn, self._requests(conn))
            except (ConnectionResetError, BrokenPipeError):
                pass  # the client dropped the connection: what some tests ask of it
        self.closed += 1

    def _requests(self, conn):
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, data = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(data) < length:
                data += conn.recv(65536)
            request, data = head + b"\r\n\r\n" + data[:length], data[length:]
            self.requests.append(request)
            yield request

    @property
    def endpoint(self):
        return _http1.Endpoint("127.0.0.1", self.port, 2.0, 2.0)

    def close(self):
        self.listener.close()


@pytest.fixture
def scripted():
    servers = []

    def make(script):
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def keep_answering(conn, requests):
    for _ in requests:
        conn.sendall(answer())


def answer_once_then_close_when_idle(conn, requests):
    for _ in requests:
        conn.sendall(answer())
        time.sleep(0.05)
        return  # the connection closes, idle (a keep-alive timeout on the server's side)


def prepared():
    return _http1.Prepared("m", "/v2/models/m/infer", b'{"inputs": []}')


def test_one_connection_carries_request_after_request(scripted):
    server = scripted(keep_answering)
    connections = _http1.Connections(server.endpoint)
    for _ in range(5):
        assert connections.send(prepared()).get_output("OUTPUT0")["shape"] == [2, 3]
    assert server.accepted == 1
    assert server.requests[0].startswith(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:")
    connections.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_and_the_request_sent_once(scripted):
    server = scripted(answer_once_then_close_when_idle)
    connections = _http1.Connections(server.endpoint)
    connections.send(prepared())
    time.sleep(0.2)  # the server closed it meanwhile
    connections.send(prepared())
    assert server.accepted == 2 and len(server.requests) == 2
    connections.close()


def test_a_request_the_server_read_then_dropped_is_not_sent_again(scripted):
    def drop_the_second(conn, requests):
        for i, _ in enumerate(requests):
            if i == 1:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Len")  # part of an answer: it may have run
                return
            conn.sendall(answer())

    server = scripted(drop_the_second)
    connections = _http1.Connections(server.endpoint)
    connections.send(prepared())
    with pytest.raises(ServerUnavailable, match="cannot reach"):
        connections.send(prepared())
    assert len(server.requests) == 2
    connections.close()


@pytest.fixture(params=["sync", "async"])
def driver(request):
    """``(make, send)`` for one of the two drivers: a new Connections, and a blocking call sending
    a request on it (the asyncio one on a loop of its own per call)."""
    if request.param == "sync":
        return _http1.Connections, lambda connections, prepared: connections.send(prepared)
    return _http1.AsyncConnections, lambda connections, prepared: asyncio.run(connections.send(prepared))


def run_once_then_close_before_answering_the_second(conn, requests):
    for i, _ in enumerate(requests):
        if i == 1:
            return  # read it, maybe ran it, closed without a byte of an answer
        conn.sendall(answer())


def test_an_idempotent_request_meeting_a_closed_kept_connection_goes_once_more(scripted, driver):
    make, send = driver
    server = scripted(run_once_then_close_before_answering_the_second)
    connections = make(server.endpoint)
    send(connections, prepared())
    send(connections, prepared())  # read and dropped, then sent on a fresh connection
    assert server.accepted == 2 and len(server.requests) == 3
    connections.close()


@pytest.mark.parametrize("request_made", [
    lambda: _http1.Prepared("m", "/v2/models/m/infer", b"{}", idempotent=False),
    lambda: _http1.prepare("m", "", [], [], {"sequence_id": 42, "sequence_start": True}),
])
def test_a_request_not_idempotent_is_never_sent_twice(scripted, driver, request_made):
    make, send = driver
    server = scripted(run_once_then_close_before_answering_the_second)
    connections = make(server.endpoint)
    send(connections, request_made())
    with pytest.raises(ServerUnavailable, match="cannot reach"):
        send(connections, request_made())  # it went out and may have run: not again
    assert server.accepted == 1 and len(server.requests) == 2
    connections.close()


def test_a_kept_connection_the_server_closed_is_dropped_before_a_request_goes_on_it(scripted, driver):
    make, send = driver
    server = scripted(answer_once_then_close_when_idle)
    connections = make(server.endpoint)
    once = _http1.Prepared("m", "/v2/models/m/infer", b"{}", idempotent=False)
    send(connections, once)
    while not server.closed:  # the server closes it meanwhile: seen before sending, so even this one goes
        time.sleep(0.01)
    assert send(connections, once).get_output("OUTPUT0")["shape"] == [2, 3]
    assert server.accepted == 2 and len(server.requests) == 2
    connections.close()


def test_a_kept_connection_with_bytes_nobody_asked_for_is_dropped(scripted, driver):
    stray = threading.Event()

    def answer_then_more(conn, requests):
        for i, _ in enumerate(requests):
            conn.sendall(answer())
            if i == 0:
                time.sleep(0.05)
                conn.sendall(answer(b'{"error": "a second answer"}', "500 Internal Server Error"))
                stray.set()

    make, send = driver
    server = scripted(answer_then_more)
    connections = make(server.endpoint)
    send(connections, prepared())
    assert stray.wait(5.0)
    time.sleep(0.05)  # the stray answer is on the kept connection now: it would be read as the next one's
    assert send(connections, prepared()).get_output("OUTPUT0")["shape"] == [2, 3]
    assert server.accepted == 2
    connections.close()


def test_bytes_past_the_body_keep_the_answer_and_drop_the_connection(scripted, driver):
    make, send = driver
    server = scripted(lambda conn, requests: [conn.sendall(answer() + b"HTTP/1.1 200 OK\r\n") for _ in requests])
    connections = make(server.endpoint)
    for _ in range(2):
        assert send(connections, prepared()).get_output("OUTPUT0")["shape"] == [2, 3]
    assert server.accepted == 2 and not connections._idle
    connections.close()


def test_an_interim_answer_is_skipped_and_the_connection_stays_in_step(scripted, driver):
    def continue_then_answer(conn, requests):
        for i, _ in enumerate(requests):
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            time.sleep(0.02)
            conn.sendall(answer(json.dumps({"outputs": [], "model_version": str(i)}).encode()))

    make, send = driver
    server = scripted(continue_then_answer)
    connections = make(server.endpoint)
    versions = [send(connections, prepared()).get_response()["model_version"] for _ in range(3)]
    assert versions == ["0", "1", "2"] and server.accepted == 1  # each request read its own answer
    connections.close()


@pytest.mark.parametrize("bad", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
                                 b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
                                 b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"])
def test_a_malformed_answer_fails_at_once_not_at_the_network_timeout(scripted, driver, bad):
    make, send = driver
    server = scripted(lambda conn, requests: [(conn.sendall(bad), time.sleep(1.2)) for _ in requests])
    connections = make(server.endpoint)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="not HTTP/1.1 as expected"):
        send(connections, prepared())
    assert time.monotonic() - t0 < 1.0 and not connections._open
    assert len(server.requests) == 1  # it may have run: never again
    connections.close()


def test_the_blocking_driver_waits_in_the_kernel():
    """SO_RCVTIMEO / SO_SNDTIMEO on a blocking socket, not a Python timeout (which polls before
    every send and receive); none at all without a network_timeout."""
    import struct

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        for timeout, expected in ((2.5, (2, 500000)), (None, (0, 0))):
            connections = _http1.Connections(_http1.Endpoint("127.0.0.1", port, 1.0, timeout))
            sock = connections._connect("testing")
            assert sock.gettimeout() is None
            for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                assert struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, option, 16)) == expected
            listener.accept()[0].close()
            connections.close()


def test_a_send_the_server_never_reads_times_out(scripted):
    done = threading.Event()
    server = scripted(lambda conn, requests: done.wait(5.0))  # never reads
    connections = _http1.Connections(server.endpoint._replace(network_timeout=0.2))
    big = _http1.Prepared("m", "/v2/models/m/infer", bytes(64 << 20))  # more than the sockets' buffers
    t0 = time.monotonic()
    with pytest.raises(ServerTimeout, match="network_timeout=0.2"):
        connections.send(big)
    assert time.monotonic() - t0 < 1.5
    done.set()
    connections.close()


def test_no_answer_within_the_network_timeout(scripted):
    server = scripted(lambda conn, requests: [time.sleep(1.0) for _ in requests])
    connections = _http1.Connections(server.endpoint._replace(network_timeout=0.2))
    t0 = time.monotonic()
    with pytest.raises(ServerTimeout, match="network_timeout=0.2"):
        connections.send(prepared())
    assert time.monotonic() - t0 < 0.9
    connections.close()


def test_nobody_listening():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed at once: nothing listens there
    with pytest.raises(ServerUnavailable, match=f"127.0.0.1:{port}"):
        _http1.Connections(_http1.Endpoint("127.0.0.1", port, 1.0, 1.0)).send(prepared())


def test_close_wakes_a_request_waiting_for_its_answer(scripted):
    server = scripted(lambda conn, requests: [time.sleep(1.5) for _ in requests])
    connections = _http1.Connections(server.endpoint)
    failure = []

    def send():
        try:
            connections.send(prepared())
        except Exception as exc:  # noqa: BLE001 -- kept for the assertion
            failure.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    while not server.requests:
        time.sleep(0.01)
    t0 = time.monotonic()
    connections.close()
    thread.join(2.0)
    assert time.monotonic() - t0 < 1.0
    assert isinstance(failure[0], ClientClosed)
    with pytest.raises(ClientClosed):
        connections.send(prepared())


def test_async_connections_are_kept_replaced_and_time_out(scripted):
    async def main():
        server = scripted(answer_once_then_close_when_idle)
        connections = _http1.AsyncConnections(server.endpoint)
        results = await asyncio.gather(*[connections.send(prepared()) for _ in range(4)])
        assert all(r.get_output("OUTPUT0")["shape"] == [2, 3] for r in results)
        assert server.accepted == 4  # one connection per request in flight
        await asyncio.sleep(0.2)       # the server closed them all, idle
        await connections.send(prepared())
        assert server.accepted == 5 and len(server.requests) == 5
        connections.close()

        slow = scripted(lambda conn, requests: [time.sleep(1.0) for _ in requests])
        connections = _http1.AsyncConnections(slow.endpoint._replace(network_timeout=0.2))
        with pytest.raises(ServerTimeout):
            await connections.send(prepared())
        task = asyncio.ensure_future(connections.send(prepared()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not connections._open and connections._idle == []  # a half-read connection is dropped
        connections.close()

    asyncio.run(main())


# -- the clients, against a real Triton -----------------------------------------------


@pytest.fixture
def no_tritonclient_infer(monkeypatch):
    """tritonclient.http's infer fails: what still works went on our own sockets."""
    import tritonclient.http as httpclient
    import tritonclient.http.aio as aiohttpclient

    def refuse(*args, **kwargs):
        raise AssertionError("went through tritonclient.http's infer")

    monkeypatch.setattr(httpclient.InferenceServerClient, "infer", refuse)
    monkeypatch.setattr(aiohttpclient.InferenceServerClient, "infer", refuse)


def test_http_requests_go_on_the_callers_socket(server, no_tritonclient_infer):
    x = np.arange(1024, dtype=np.float32)
    with tritonshm.Client(f"http://{server.http_url}") as c:
        for i in range(3):  # the full way, then the quick path
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + i})["OUTPUT0"], x + i)
        with c.request("identity_fp32", shapes={"INPUT0": x.shape}) as request:
            request.inputs["INPUT0"][:] = x
            np.testing.assert_array_equal(request.run()["OUTPUT0"], x)
        big = np.ones(3 << 20, np.float32)  # not a quick request: the full way, the same socket
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": big})["OUTPUT0"], big)


def test_http_options_still_go_through_tritonclient(server):
    x = np.arange(16, dtype=np.float32)
    with tritonshm.Client(f"http://{server.http_url}") as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x}, priority=1)["OUTPUT0"], x)


def test_http_regions_the_server_forgot_are_registered_again(server, no_tritonclient_infer):
    x = np.arange(256, dtype=np.float32)
    with tritonshm.Client(f"http://{server.http_url}") as c:
        c.infer("identity_fp32", {"INPUT0": x})
        c.infer("identity_fp32", {"INPUT0": x})
        for pool in c.pools():
            for name in pool.regions:
                tritonshm.unregister(c.tritonclient, name)  # behind the client's back
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + 1})["OUTPUT0"], x + 1)


def test_aio_http_requests_go_on_the_loops_sockets(server, no_tritonclient_infer):
    x = np.arange(512, dtype=np.float32)

    async def main():
        async with tritonshm.aio.Client(f"http://{server.http_url}") as c:
            outs = await asyncio.gather(*[c.infer("identity_fp32", {"INPUT0": x + i}) for i in range(16)])
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out["OUTPUT0"], x + i)

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_talks_on_its_parents_connections(scripted):
    server = scripted(keep_answering)
    connections = _http1.Connections(server.endpoint)
    connections.send(prepared())
    pid = os.fork()
    if pid == 0:  # the child: a connection of its own
        try:
            connections.send(prepared())
            os._exit(0 if server.accepted == 1 else 3)  # server.accepted is the parent's count, frozen
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    connections.send(prepared())  # the parent's connection still works: the child did not shut it
    assert server.accepted == 2   # the parent's one, the child's own
    connections.close()


def test_async_close_wakes_a_request_waiting_for_its_answer(scripted):
    async def main():
        server = scripted(lambda conn, requests: [time.sleep(1.5) for _ in requests])
        connections = _http1.AsyncConnections(server.endpoint)
        task = asyncio.ensure_future(connections.send(prepared()))
        while not server.requests:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        connections.close()
        with pytest.raises(ClientClosed):
            await task
        assert time.monotonic() - t0 < 1.0
        assert not connections._open
        with pytest.raises(ClientClosed):
            await connections.send(prepared())

    asyncio.run(main())


def test_an_endpoint_from_an_address_and_tritonclients_connect_options():
    assert _http1.Endpoint.parse("localhost:8000") == _http1.Endpoint("localhost", 8000, 60.0, 60.0)
    assert _http1.Endpoint.parse("[::1]:8000", {"network_timeout": 5, "concurrency": 4}) == \
        _http1.Endpoint("::1", 8000, 60.0, 5.0)
    assert _http1.Endpoint.parse("h:1", {"connection_timeout": None}).connection_timeout is None
    assert _http1.Connections(_http1.Endpoint.parse("[::1]:8000")).host == b"[::1]:8000"  # the Host header


def test_a_burst_leaves_at_most_max_idle_connections_open(scripted, monkeypatch):
    monkeypatch.setattr(_http1, "_MAX_IDLE", 3)

    async def main():
        server = scripted(keep_answering)
        connections = _http1.AsyncConnections(server.endpoint)
        await asyncio.gather(*[connections.send(prepared()) for _ in range(8)])
        assert server.accepted == 8
        assert len(connections._idle) == 3 and set(connections._open) == set(connections._idle)
        connections.close()

    asyncio.run(main())


def test_http_requests_with_options_and_tensors_in_the_messages_go_on_the_socket_too(server, no_tritonclient_infer,
                                                                                      monkeypatch):
    sent = []
    real = _http1.Connections.send

    def send(self, request, again=None):
        sent.append(request)
        return real(self, request, again)

    monkeypatch.setattr(_http1.Connections, "send", send)
    x = np.arange(1024, dtype=np.float32)
    url = f"http://{server.http_url}"
    with tritonshm.Client(url, headers={"x-tenant": "acme"}) as c:  # every request has options: per call
        out = c.infer("identity_fp32", {"INPUT0": x}, request_compression_algorithm="gzip",
                      response_compression_algorithm="deflate", priority=1)
        np.testing.assert_array_equal(out["OUTPUT0"], x)
        assert sent[-1].headers["x-tenant"] == "acme" and sent[-1].headers["Content-Encoding"] == "gzip"
    with tritonshm.Client(url) as c:
        c.infer("identity_fp32", {"INPUT0": x}, idempotent=False)
        assert sent[-1].idempotent is False
        c.infer("identity_fp32", {"INPUT0": x})
        assert sent[-1].idempotent is True
    with tritonshm.Client(url, transport="wire") as c:  # tensors inside the messages, both ways
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        assert "Inference-Header-Content-Length" in sent[-1].headers
    with tritonshm.Client(url) as c:  # BYTES through the slot, sizes of their own per call
        words = np.array([b"a", b"bc", b"def"], dtype=np.object_)
        np.testing.assert_array_equal(c.infer("identity_bytes", {"INPUT0": words})["OUTPUT0"], words)


def test_verbose_http_clients_go_through_tritonclient_which_prints_them(server, capsys):
    x = np.arange(64, dtype=np.float32)
    with tritonshm.Client(f"http://{server.http_url}", verbose=True) as c:
        for i in range(3):  # the full way, then the quick path: both with a message made ready ahead
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + i})["OUTPUT0"], x + i)

    async def main():
        async with tritonshm.aio.Client(f"http://{server.http_url}", verbose=True) as c:
            for i in range(3):
                np.testing.assert_array_equal((await c.infer("identity_fp32", {"INPUT0": x + i}))["OUTPUT0"], x + i)

    asyncio.run(main())
    assert capsys.readouterr().out.count("infer") >= 6  # tritonclient printed each request


def test_a_server_restart_under_kept_connections(fresh_server, no_tritonclient_infer):
    """The connections kept open die with the server: the next request goes on a fresh one, finds
    the server forgot our regions, registers them again and runs -- sync and asyncio."""
    x = np.arange(256, dtype=np.float32)
    url = f"http://{fresh_server.http_url}"
    with tritonshm.Client(url) as c:
        for i in range(3):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + i})["OUTPUT0"], x + i)
        fresh_server.restart()
        for i in range(3):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x - i})["OUTPUT0"], x - i)

    async def main():
        async with tritonshm.aio.Client(f"http://{fresh_server.http_url}") as c:
            outs = await asyncio.gather(*[c.infer("identity_fp32", {"INPUT0": x + i}) for i in range(4)])
            fresh_server.restart()
            outs += await asyncio.gather(*[c.infer("identity_fp32", {"INPUT0": x + i}) for i in range(4, 8)])
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out["OUTPUT0"], x + i)

    asyncio.run(main())
