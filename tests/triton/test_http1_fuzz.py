"""tritonshm._http1.ResponseReader against h11 (a test-only dependency) as the reference reader of
HTTP/1.1 answers: generated answers of every framing, then mutated at random bytes, fed in reads
of random sizes.

Whenever h11 takes an answer, ours gives the same status, body and keep-alive decision, or
refuses it (a ``ValueError``, or no answer once the connection ends).  Whenever h11 refuses one,
ours refuses it too.  The one leniency (see ResponseReader's documentation) is HTTP/1.0's
``Connection: keep-alive``, which ours honours (RFC 9112 9.3) and h11 does not.  And every
answer generated whole (not mutated) is one ours takes: the generator writes only what a server
may send and ours must read.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tritonshm import _http1

TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~", min_size=1,
                max_size=12)
VALUE = st.text("".join(map(chr, range(0x20, 0x7f))) + "\t\xe9", max_size=20).map(str.strip)
#: Bytes a mutation writes: the grammar's punctuation, digits, letters, controls and any byte.
NOISE = st.one_of(st.sampled_from(list(b"\r\n :;,\t-+_0123456789abcdefxHTP/.\x00\x7f\x80")),
                  st.integers(0, 255))
EXTRA_HEADERS = ("Content-Type: application/json", "Server: triton", "Inference-Header-Content-Length: 12")


@st.composite
def answers(draw) -> bytes:
    """An answer a server may send to a POST: interim answers, then a final one framed by
    Content-Length, chunked or the connection's end, with any of the headers that matter."""
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 400, 404, 500, 503]))
    body = b"" if status in (204, 304) else draw(st.binary(max_size=80))
    framing = draw(st.sampled_from(["length", "chunked", "close"] if version == "1.1" else ["length", "close"]))
    reason = draw(st.sampled_from([" OK", " Some Reason", " ", ""]))
    headers = [f"{draw(TOKEN)}: {draw(VALUE)}" for _ in range(draw(st.integers(0, 2)))]
    headers += draw(st.lists(st.sampled_from(EXTRA_HEADERS), max_size=2))
    connection = draw(st.sampled_from([None, "close", "keep-alive", "Keep-Alive, Upgrade", "x-close"]))
    if connection is not None:
        headers.append(f"Connection: {connection}")
    out = b""
    if version == "1.1":
        for interim in draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2)):
            out += f"HTTP/1.1 {interim} Interim\r\n".encode()
            out += b"".join(f"{h}\r\n".encode() for h in draw(st.lists(st.sampled_from(EXTRA_HEADERS), max_size=1)))
            out += b"\r\n"
    if framing == "length":
        headers.append(f"Content-Length: {len(body)}")
        if draw(st.booleans()):  # the same length again: one length (RFC 9110 8.6)
            headers.append(f"Content-Length: {len(body)}" if draw(st.booleans()) else
                           f"content-length: {len(body)}, {len(body)}")
        payload = body
    elif framing == "chunked":
        headers.append(draw(st.sampled_from(["Transfer-Encoding: chunked", "transfer-encoding: Chunked"])))
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        payload = b""
        for start, end in zip([0, *cuts], [*cuts, len(body)]):
            if end > start:
                ext = draw(st.sampled_from(["", ";a=b", ';name="quoted value"', "  "]))
                payload += f"{end - start:{draw(st.sampled_from(['x', 'X', '04x']))}}{ext}\r\n".encode()
                payload += body[start:end] + b"\r\n"
        payload += b"0\r\n" + b"".join(f"{h}\r\n".encode() for h in draw(st.lists(
            st.sampled_from(["X-Trailer: 1", "Server-Timing: a;dur=1"]), max_size=2))) + b"\r\n"
    else:
        payload = body
    order = draw(st.permutations(headers))
    out += f"HTTP/{version} {status}{reason}\r\n".encode() + b"".join(f"{h}\r\n".encode("latin-1") for h in order)
    out += b"\r\n" + payload
    if framing != "close" and draw(st.integers(0, 4)) == 0:
        out += draw(st.sampled_from([b"HTTP/1.1 200 OK\r\n", b"\r\n", b"x"]))  # bytes nobody asked for
    return out


@st.composite
def mutated(draw) -> bytes:
    """An answer with a few random bytes replaced, inserted, deleted or repeated."""
    data = bytearray(draw(answers()))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["replace", "insert", "delete", "repeat"]))
        if how == "replace" and at < len(data):
            data[at] = draw(NOISE)
        elif how == "insert":
            data[at:at] = bytes([draw(NOISE)])
        elif how == "delete":
            del data[at:at + draw(st.integers(1, 3))]
        else:
            data[at:at] = data[at:at + draw(st.integers(1, 8))]
    return bytes(data)


@st.composite
def reads(draw, data: bytes) -> list[bytes]:
    """*data* as a server's writes arrive: in pieces of random sizes (none empty)."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(data) - 1, 1)), max_size=6))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]


def h11_reading(data: bytes):
    """``(status, body, keep_alive, end, response)`` as h11 reads *data* and then the connection's
    end (end: where the answer ends in *data*), or None if h11 refuses it."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/v2/models/m/infer",
                          headers=[("Host", "localhost:8000"), ("Content-Length", "2")]))
    conn.send(h11.Data(data=b"{}"))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    response, body, closed = None, b"", False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is h11.NEED_DATA and not closed:  # the connection's end, only once all bytes are read
            conn.receive_data(b"")
            closed = True
        elif type(event) is h11.Response:
            response = event
        elif type(event) is h11.Data:
            body += event.data
        elif type(event) is h11.EndOfMessage:
            break
        elif type(event) is not h11.InformationalResponse:  # closed, or waiting: no whole answer
            return None
    # An answer that needed the connection's end to end leaves no connection to keep.
    keep_alive = conn.their_state is h11.DONE and not closed
    return response.status_code, body, keep_alive, len(data) - len(conn.trailing_data[0]), response


def our_reading(pieces: list[bytes]):
    """``(response, bytes fed)`` as ResponseReader reads *pieces*, then the connection's end (a
    driver stops reading at the answer's end), or None if it refuses them."""
    reader, fed = _http1.ResponseReader(), 0
    try:
        for piece in pieces:
            fed += len(piece)
            response = reader.feed(piece)
            if response is not None:
                return response, fed
        response = reader.eof()
    except ValueError:
        return None
    return None if response is None else (response, fed)


def honours_http10_keep_alive(response: h11.Response) -> bool:
    """The documented leniency: HTTP/1.0 with ``Connection: keep-alive`` (and no ``close``)."""
    options = {value.strip().lower() for name, value in response.headers if name == b"connection"
               for value in value.split(b",")}
    return response.http_version == b"1.0" and b"keep-alive" in options and b"close" not in options


def check(data: bytes, pieces: list[bytes]) -> tuple[object, object]:
    theirs, ours = h11_reading(data), our_reading(pieces)
    if theirs is None:
        assert ours is None, f"h11 refuses, ours read {ours!r}"
    elif ours is not None:
        status, body, keep_alive, end, response = theirs
        ours_response, fed = ours
        assert (ours_response.status, ours_response.body) == (status, body)
        expected = keep_alive and fed <= end  # bytes past the answer in what ours read: out of step
        if ours_response.keep_alive != expected:
            assert ours_response.keep_alive and honours_http10_keep_alive(response) and fed <= end
    return theirs, ours


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data())
def test_every_answer_a_server_may_send_is_read_as_h11_reads_it(data):
    answer = data.draw(answers())
    theirs, ours = check(answer, data.draw(reads(answer)))
    assert theirs is not None, "the generator wrote an answer h11 refuses"
    assert ours is not None, "a valid answer refused"


@SETTINGS
@given(st.data())
def test_a_mutated_answer_is_refused_or_read_as_h11_reads_it(data):
    answer = data.draw(mutated())
    theirs, ours = check(answer, data.draw(reads(answer)))
    # What was tried (pytest --hypothesis-show-statistics): both readers must meet both outcomes.
    event(f"h11 {'reads' if theirs else 'refuses'}, ours {'reads' if ours else 'refuses'}")


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n0123456789",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",  # the leniency
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1",
])
def test_the_cases_of_issue_25_against_h11(data):
    for cut in range(1, len(data)):
        check(data, [data[:cut], data[cut:]])
