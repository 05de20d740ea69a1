"""HTTP/1.1 for inference requests: kept-alive sockets, no thread hand-off.

A request whose tensors all live in shared memory is a few hundred bytes of
JSON each way, made once per slot (:func:`prepare`).  tritonclient's HTTP
client sends it through geventhttpclient, which must stay on the greenlet
hub of the thread that made it (so tritonshm handed every call to an I/O
thread) and costs about 170 us of CPU a call; a kept-alive socket written and
read by the caller's thread costs about 30.  Measured against a local Triton
(4 KiB FP32 identity, calls interleaved): 240 us a call on a socket, 420
through tritonclient.http, 540 through tritonclient.grpc.

The module is the wire and nothing else, in the way of h11: :func:`prepare`
builds what tritonclient.http's ``infer`` would send (with its own request
builder, options, compression and tensors' bytes included), a sans-I/O
:class:`ResponseReader` takes bytes and gives one response, :func:`result_of`
reads it (JSON alone: a :class:`Result`; tensors' bytes or compression:
tritonclient's ``InferResult``), and two drivers own the sockets --
:class:`Connections` (blocking, any thread) and :class:`AsyncConnections`
(asyncio).  Each keeps up to 32 idle connections and opens one more when all
are busy: a request has a connection to itself, HTTP/1.1 without
pipelining.  An idle connection is checked before it is used again (a
poll, no wait): one the server closed meanwhile (its keep-alive ran out, it
restarted), or that holds bytes nobody asked for, is dropped.  A request
that still meets a closed one (the server closed it in the meantime) goes
once more on a fresh connection if it is idempotent and not one byte of an
answer came back; a request in a sequence, or marked not idempotent, never
goes twice: the server may have run it.  TLS, ``verbose`` and every call but
inference go through tritonclient.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import select
import socket
import struct
import threading
import weakref
import zlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence
from urllib.parse import quote

from .errors import ClientClosed, Error, Outcome, ServerError, ServerTimeout, ServerUnavailable
from . import _tritonclient_compat
from .errors import no_server_hint, translate_error

__all__ = ["Endpoint", "Prepared", "Response", "ResponseReader", "Result", "prepare", "result_of",
           "Connections", "AsyncConnections"]

_RECV_BYTES = 65536          # a read's size while the answer's length is not known
_RECV_MAX = 4 << 20           # a read's size at most
_HEAD_MAX = 1 << 20           # a response's head longer than this is not Triton's
_JOIN_BYTES = 64 << 10        # a request body up to this size is joined to its head: one write
_MAX_IDLE = 32  # connections kept open between requests; a burst's extra ones are closed after it


class Endpoint(NamedTuple):
    """Where and how patiently to talk: tritonclient.http's defaults are 60 s for both."""

    host: str
    port: int
    connection_timeout: float | None = 60.0  #: seconds to open a connection (None: no limit)
    network_timeout: float | None = 60.0     #: seconds a request may wait for its answer (None: no limit)

    @classmethod
    def parse(cls, address: str, options: dict[str, Any] | None = None) -> "Endpoint":
        """From ``"host:port"`` (``"[::1]:8000"`` for IPv6) and tritonclient.http's
        ``connection_timeout`` / ``network_timeout`` among the client's connect options --
        or tritonclient.http.aio's one ``conn_timeout`` (aiohttp's total), for both."""
        host, _, port = address.rpartition(":")
        options = options or {}
        either = options.get("conn_timeout", 60.0)

        def seconds(name: str) -> float | None:
            value = options.get(name, either)
            return None if value is None else float(value)

        return cls(host.strip("[]") or "localhost", int(port), seconds("connection_timeout"),
                   seconds("network_timeout"))


class Prepared:
    """One inference request made ready to send, as many times as wanted: the target, headers
    and body tritonclient.http would send for the same inputs, outputs and options.

    *idempotent*: whether running it twice does no harm, so that it may go once more on a
    fresh connection when a kept one turns out closed before any byte of an answer came.  A
    request that is not is never sent again once any of its bytes went out.

    *last* is the last answer to it, ``(body, Result, what the client read of it)``: an answer
    that is the same, byte for byte (a warm request's is), is that :class:`Result` again
    (:func:`result_of`), and what was read of it is known
    (:func:`~tritonshm.client._results.answered_shapes`), as for gRPC's
    :class:`~tritonshm._transport.ReadyRequest`."""

    __slots__ = ("model", "target", "body", "headers", "idempotent", "last", "_wire")

    def __init__(self, model: str, target: str, body: bytes, headers: Mapping[str, Any] | None = None,
                 idempotent: bool = True):
        self.model = model
        self.target = target
        self.body = body
        self.idempotent = idempotent
        self.headers = dict(headers or {})
        for name, value in self.headers.items():
            if any(c in f"{name}{value}" for c in "\r\n"):  # checked by RequestOptions; never let one through
                raise ValueError(f"header {name!r}: no line breaks in a header")
        self._wire: tuple[bytes, tuple[bytes, ...]] | None = None  # (host header, what goes on the socket)
        self.last: tuple[bytes | None, Any, Any] = (None, None, None)

    def wire(self, host: bytes) -> tuple[bytes, ...]:
        """The request's bytes for a server known as *host*, to write in order: one piece, or the
        head and a large body apart (not copied into one).  Kept for the next time."""
        kept = self._wire
        if kept is None or kept[0] is not host:
            extra = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
            head = (f"POST {self.target} HTTP/1.1\r\nHost: ".encode() + host
                    + f"\r\nContent-Type: application/json\r\n{extra}Content-Length: {len(self.body)}\r\n\r\n"
                    .encode())
            pieces = (head + self.body,) if len(self.body) <= _JOIN_BYTES else (head, self.body)
            kept = self._wire = (host, pieces)
        return kept[1]


def prepare(model: str, version: str, inputs: Sequence[Any], outputs: Sequence[Any],
            options: Mapping[str, Any] | None = None, idempotent: bool | None = None) -> Prepared:
    """The request for tritonclient.http ``InferInput`` / ``InferRequestedOutput`` objects -- a copy
    of what they say now (binding them again later leaves it be).  *options*: tritonclient.http's
    ``infer`` keyword arguments (``parameters``, ``priority``, ``timeout``, ``headers``,
    ``sequence_id`` / ``_start`` / ``_end``, ``request_id``, the two compression algorithms).

    *idempotent* (see :class:`Prepared`): False, or a request in a sequence (a step of a stateful
    model, whose state would advance twice), is never sent twice; None or True lets any other
    request go once more after a kept connection failed before any byte of its answer."""
    options = dict(options or {})
    in_sequence = options.get("sequence_id", 0) not in (0, "")
    headers = dict(options.pop("headers", None) or {})
    request_compression = options.pop("request_compression_algorithm", None)
    response_compression = options.pop("response_compression_algorithm", None)
    body, json_size = _tritonclient_compat.http_request(
        inputs=inputs, request_id=options.pop("request_id", ""), outputs=outputs,
        sequence_id=options.pop("sequence_id", 0), sequence_start=options.pop("sequence_start", False),
        sequence_end=options.pop("sequence_end", False), priority=options.pop("priority", 0),
        timeout=options.pop("timeout", None), custom_parameters=options.pop("parameters", None))
    if options:
        raise TypeError(f"prepare() got options it does not know: {', '.join(sorted(options))}")
    # As tritonclient.http's infer does, in its order.
    if request_compression == "gzip":
        headers["Content-Encoding"], body = "gzip", gzip.compress(body)
    elif request_compression == "deflate":
        headers["Content-Encoding"], body = "deflate", zlib.compress(body)
    if response_compression in ("gzip", "deflate"):
        headers["Accept-Encoding"] = response_compression
    if json_size is not None:  # tensors' bytes follow the JSON
        headers["Inference-Header-Content-Length"] = json_size
    if version:
        target = f"/v2/models/{quote(model)}/versions/{quote(version)}/infer"
    else:
        target = f"/v2/models/{quote(model)}/infer"
    return Prepared(model, target, body, headers, (idempotent is None or bool(idempotent)) and not in_sequence)


# -- the response, sans I/O ---------------------------------------------------


class Response(NamedTuple):
    """One HTTP response, whole."""

    status: int
    headers: dict[str, str]   #: names in lower case; a header given twice: its values joined with ", "
    body: bytes
    keep_alive: bool          #: whether the connection may carry another request


class ResponseReader:
    """Bytes in (:meth:`feed`), one :class:`Response` out once it is all there.

    Understands what a server may answer a POST with (RFC 9112): a body of
    ``Content-Length`` bytes, ``chunked`` (trailers read and dropped), or up to
    the end of the connection; ``Connection: close`` or ``keep-alive``,
    HTTP/1.0 or 1.1; interim ``1xx`` answers before the final one, skipped.
    Anything else is a ``ValueError``, raised as soon as the bytes show it:
    a malformed head or chunk size, a ``Content-Length`` that is not ASCII
    digits or given twice with different values, a ``Transfer-Encoding``
    other than one ``chunked`` (or beside a ``Content-Length``), a ``101``
    (no request here asks to switch protocols).  A response followed by
    bytes nobody asked for says ``keep_alive=False``: the connection is not
    in step any more.

    Leniencies, against h11's reading (tests/triton/test_http1_fuzz.py holds
    the two together): an HTTP/1.0 answer with ``Connection: keep-alive``
    keeps the connection (RFC 9112 9.3; h11 never keeps 1.0 ones), and a head
    may be up to 1 MiB (h11: 16 KiB).  Stricter than h11 (refused here):
    control characters in a head, line folding, bare LF line ends, HTTP
    versions but 1.0 and 1.1, chunk sizes of over 16 hex digits, chunked
    with HTTP/1.0 or beside a Content-Length, framing headers in trailers.

    Bytes are gathered in one growing buffer (a large body costs its size,
    not its size times its reads); a whole answer in one read is never
    copied into it.
    """

    __slots__ = ("_buffer", "_head", "_chunks", "_at", "_fed")

    def __init__(self) -> None:
        self._fed = False                # whether any byte came (an interim answer leaves none behind)
        self._buffer = bytearray()
        self._head: tuple[int, dict[str, str], bool, int | None] | None = None  # the final answer's
        self._chunks: list[bytes] = []   # a chunked body's chunks so far
        self._at = 0                     # where the next chunk starts in the buffer

    @property
    def started(self) -> bool:
        """Whether any byte of the answer came."""
        return self._fed

    def wanted(self) -> int:
        """How many bytes to ask the socket for next: the rest of a body of known length (up to
        a few MiB a read), else 64 KiB."""
        if self._head is not None and self._head[3] is not None and self._head[3] >= 0:
            return min(max(self._head[3] - len(self._buffer), _RECV_BYTES), _RECV_MAX)
        return _RECV_BYTES

    def feed(self, data: bytes | bytearray) -> Response | None:
        """Take the next bytes read; the response once complete, else None."""
        self._fed = True
        if self._head is None:
            if self._buffer:  # a head begun in an earlier read
                self._buffer += data
                data = self._buffer
            # Interim (1xx) answers first, each a head alone; then the final one's head.
            at = 0
            while True:
                end = data.find(b"\r\n\r\n", at)
                if end < 0:
                    self._wait_for_head(data, at)
                    return None
                head = _head(bytes(data[at:end + 2]))
                at = end + 4
                if head[0] >= 200:
                    break
            status, headers, keep_alive, length = self._head = head
            if length is not None and length >= 0 and len(data) - at >= length:  # all there: no copy
                if len(data) - at > length:
                    keep_alive = False  # bytes past the body: the connection is out of step
                return Response(status, headers, bytes(data[at:at + length]), keep_alive)
            if data is self._buffer:
                del data[:at]
            else:
                self._buffer = bytearray(data[at:])
        else:
            self._buffer += data
            status, headers, keep_alive, length = self._head
        buffer = self._buffer
        if length is None:
            return None  # the body runs to the end of the connection: see eof()
        if length < 0:
            return self._dechunk(status, headers, keep_alive)
        if len(buffer) < length:
            return None
        return Response(status, headers, bytes(buffer) if len(buffer) == length else bytes(buffer[:length]),
                        keep_alive and len(buffer) == length)

    def eof(self) -> Response | None:
        """The connection closed: a body without a length ends here (None if no final head came:
        the connection's end is the caller's error, whatever came before)."""
        if self._head is None:
            return None
        status, headers, _, length = self._head
        if length is None:
            return Response(status, headers, bytes(self._buffer), False)
        raise ValueError("the server closed the connection in the middle of its answer")

    def _wait_for_head(self, data: bytes | bytearray, at: int) -> None:
        """No whole head from *at* yet: keep what came, unless it already cannot be one."""
        start = bytes(data[at:at + 5])
        if not b"HTTP/".startswith(start):
            raise ValueError(f"not an HTTP/1.x response: {bytes(data[at:at + 80])!r}")
        if len(data) - at > _HEAD_MAX:
            raise ValueError(f"no end of the response's head in its first {_HEAD_MAX} bytes")
        if data is self._buffer:
            del data[:at]
        else:
            self._buffer += data[at:]

    def _dechunk(self, status: int, headers: dict[str, str], keep_alive: bool) -> Response | None:
        """The chunks complete in the buffer, from where the last call stopped; the response
        once the last (empty) chunk and the trailers' end are in."""
        buffer, at = self._buffer, self._at
        while True:
            line = _CHUNK_LINE.match(buffer, at)
            if line is None or line[3] is None:  # not a chunk-size line, or not all of one yet
                rest = buffer[at if line is None else line.end():]
                if rest and (line is None or rest != b"\r") or len(buffer) - at > _CHUNK_LINE_MAX:
                    raise ValueError(f"malformed chunk size line: {bytes(buffer[at:at + 40])!r}")
                break  # wait for the rest of the line
            size, start = int(line[1], 16), line.end()
            if size == 0:
                end = _trailers_end(buffer, start)
                if end < 0:
                    break
                if len(buffer) > end:
                    keep_alive = False  # bytes past the body: the connection is out of step
                return Response(status, headers, b"".join(self._chunks), keep_alive)
            if len(buffer) < start + size + 2:
                break
            if buffer[start + size:start + size + 2] != b"\r\n":
                raise ValueError("a chunk's data is not followed by CRLF")
            self._chunks.append(bytes(buffer[start:start + size]))
            at = start + size + 2
        self._at = at
        return None


# A head's lines, from RFC 9110/9112's grammar (the characters h11 takes, less the controls): one
# findall gives (minor version, status, "", "") for a status line, ("", "", name, value) for a field
# line and four empty strings for each character of anything else.
_HEAD_PARTS = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: [\t\x20-\x7e\x80-\xff]*)?\r\n"
                         r"|([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*([\t\x20-\x7e\x80-\xff]*)\r\n|[\s\S]")
# A chunk-size line: hex size (2**64 at most), extensions (read, ignored), CRLF -- or its beginning.
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(;[\t\x20-\x7e\x80-\xff]*|[ \t]*)(\r\n)?")
_CHUNK_LINE_MAX = 4096


def _trailers_end(buffer: bytearray, at: int) -> int:
    """Where the trailer section from *at* ends (after its empty line), or -1 while incomplete;
    its field lines must be well-formed (they are dropped)."""
    if buffer[at:at + 2] == b"\r\n":
        return at + 2
    end = buffer.find(b"\r\n\r\n", at)
    if end < 0:
        if len(buffer) - at > _HEAD_MAX:
            raise ValueError(f"no end of the response's trailers in {_HEAD_MAX} bytes")
        return -1
    text = buffer[at:end + 2].decode("latin-1")
    for _, _, name, _ in _HEAD_PARTS.findall(text):
        if not name:
            raise ValueError(f"malformed trailer field: {_off_the_grammar(text)!r}")
        if name.lower() in ("content-length", "transfer-encoding"):  # RFC 9110 6.5.1: never in trailers
            raise ValueError(f"{name} in the trailers")
    return end + 4


def _off_the_grammar(text: str, skip: int = 0) -> str:
    """The first line of *text* (a head or trailers) after *skip* lines that is not a field line,
    as the parser judged it (for a message: only ever called when there is one)."""
    for line in text.split("\r\n")[skip:]:
        parts = _HEAD_PARTS.findall(f"{line}\r\n")
        if len(parts) != 1 or not parts[0][2]:
            return line[:80]
    return text[:80]


def _digits(value: str, what: str) -> int:
    """A decimal length: ASCII digits only (int() would also take '+5', '1_0', ' 7', '٣')."""
    if not (value.isdigit() and value.isascii()) or len(value) > 20:
        raise ValueError(f"malformed {what}: {value[:40]!r}")
    return int(value)


def _head(head: bytes) -> tuple[int, dict[str, str], bool, int | None]:
    """:func:`_parse_head`, remembered: a server answers the same head again and again (the
    same model, outputs and lengths), and checking it against the grammar costs more than the
    rest of the read.  Each response has a dict of headers of its own."""
    known = _HEADS.get(head)
    if known is None:
        known = _parse_head(head)
        if len(head) <= _HEAD_KEPT_MAX:
            if len(_HEADS) >= _HEADS_KEPT:
                _HEADS.clear()  # many kinds of answers: start over (no order to keep)
            _HEADS[head] = known
    return known[0], known[1].copy(), known[2], known[3]


_HEADS: dict[bytes, tuple[int, dict[str, str], bool, int | None]] = {}
_HEADS_KEPT = 256        # heads remembered, at most
_HEAD_KEPT_MAX = 1024    # a longer head is parsed each time


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool, int | None]:
    """Status, headers, whether the connection stays open, the body's length (-1: chunked; None:
    up to the end of the connection) of a head (its lines, each ending in CRLF).  A header given
    more than once has its values joined with ", " (RFC 9110 5.3): never "last wins"."""
    text = head.decode("latin-1")
    parts = iter(_HEAD_PARTS.findall(text))
    minor, status_code, _, _ = next(parts, ("", "", "", ""))
    if not minor:
        raise ValueError(f"not an HTTP/1.x status line: {text[:80].partition(chr(13))[0]!r}")
    status = int(status_code)
    if status < 100:
        raise ValueError(f"status {status} is not an HTTP status (100-999)")
    if status == 101:
        raise ValueError("101 Switching Protocols: no request here asks to switch protocols")
    headers: dict[str, str] = {}
    for _, _, name, value in parts:
        if not name:
            raise ValueError(f"malformed response header: {_off_the_grammar(text, 1)!r}")
        name, value = name.lower(), value.rstrip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection")
    if connection is None:
        keep_alive = minor == "1"
    else:
        options = [option.strip(" \t").lower() for option in connection.split(",")]
        keep_alive = "close" not in options and (minor == "1" or "keep-alive" in options)
    length: int | None = None
    content_length = headers.get("content-length")
    if content_length is not None:
        if not (content_length.isdigit() and content_length.isascii()):  # a list (a header given twice)
            lengths = {value.strip(" \t") for value in content_length.split(",")}
            if len(lengths) > 1:
                raise ValueError(f"conflicting Content-Length values: {content_length[:80]!r}")
            content_length = lengths.pop()
        length = _digits(content_length, "Content-Length")
    encoding = headers.get("transfer-encoding")
    if encoding is not None:
        if encoding.lower() != "chunked":
            raise ValueError(f"Transfer-Encoding {encoding[:80]!r}: only one 'chunked' is understood")
        if length is not None:  # RFC 9112 6.3: a sign of request smuggling or response splitting
            raise ValueError("both Transfer-Encoding and Content-Length")
        if minor == "0":
            raise ValueError("Transfer-Encoding in an HTTP/1.0 answer (RFC 9112 6.1: faulty framing)")
        length = -1
    if status < 200 or status in (204, 304):  # never a body, whatever the headers say
        length = 0
    elif length is None:
        keep_alive = False  # the body runs to the end of the connection
    return status, headers, keep_alive, length


class Result:
    """An inference answer read from JSON: what tritonclient.http's ``InferResult`` gives for
    outputs left in shared memory (:meth:`get_output`, :meth:`get_response`)."""

    __slots__ = ("_response", "_outputs")

    def __init__(self, response: dict[str, Any]):
        self._response = response
        self._outputs = {out["name"]: out for out in response.get("outputs", ())}

    def get_output(self, name: str) -> dict[str, Any] | None:
        """The output's JSON (name, datatype, shape, parameters), or None."""
        return self._outputs.get(name)

    def get_response(self) -> dict[str, Any]:
        """The whole answer."""
        return self._response


def result_of(response: Response, doing: str, request: Prepared | None = None) -> Any:
    """What *response* answers: a :class:`Result` when it is JSON alone (outputs left in shared
    memory) -- the one made of the last answer to *request*, if this one is the same -- or
    tritonclient.http's ``InferResult`` when tensors' bytes follow the JSON or it is compressed;
    or its error in tritonshm's terms (as tritonclient raises it: the server's ``{"error": ...}``)."""
    header_length = response.headers.get("inference-header-content-length")
    encoding = response.headers.get("content-encoding")
    last = None if request is None else request.last
    if last is not None and response.status == 200 and response.body == last[0] \
            and header_length is None and encoding is None:
        return last[1]
    if response.status == 200 and (header_length is not None or encoding is not None):
        from tritonclient.http import InferResult

        try:
            return InferResult.from_response_body(
                response.body, False, None if header_length is None else
                _digits(header_length, "Inference-Header-Content-Length"), encoding)
        except Exception as exc:  # tritonclient's own error, or a body that is not what it says
            raise translate_error(exc, doing) from exc
    body = response.body
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        answer = json.loads(body)
    except (ValueError, OSError, zlib.error):
        answer = None
    if response.status != 200 or not isinstance(answer, dict) or "error" in answer:
        raise _error_answer(response.status, answer, body, doing)  # (made elsewhere: no local holds it)
    result = Result(answer)
    if request is not None and encoding is None:
        request.last = (response.body, result, None)  # (one assignment: another thread reads one whole)
    return result


def _error_answer(status: int, answer: Any, body: bytes, doing: str) -> ServerError:
    """The error an HTTP answer other than a result (its *status*, its JSON *answer* if any)
    stands for, with where the request ended (its ``outcome``)."""
    message = answer.get("error") if isinstance(answer, dict) else None
    if not message:
        message = f"HTTP {status}: {body[:200]!r}"
    from tritonclient.utils import InferenceServerException

    # The status as tritonclient.http gives it: it tells the server's own answer from ours.
    error = translate_error(InferenceServerException(msg=message, status=str(status)), doing)
    # Triton's own answer carries its JSON error body, and never a 502 or 504 (errors.OUTCOMES):
    # anything else came from something in front of it (a gateway that gave up waiting).
    triton = isinstance(answer, dict) and bool(answer.get("error")) and status not in (502, 504)
    error.outcome = Outcome.ANSWERED if triton else Outcome.UNKNOWN
    return error


# -- the drivers -----------------------------------------------------------------


class _ConnectionsBase:
    """What both drivers know: the endpoint, the Host header, whether they were closed."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host  # IPv6: in brackets
        self.host = f"{host}:{endpoint.port}".encode()
        self.closed = False
        self._idle: list[socket.socket] = []   # list.pop/append: atomic, no lock on the way
        # Our connections, each with a poll object of its own that watches it for input: made
        # once, so that the check before reuse is one poll(2), no registration.
        self._open: dict[socket.socket, Any] = {}
        self._lock = threading.Lock()          # guards _open (taken only to open or drop one)
        _ALL.add(self)

    def _forget_inherited(self) -> None:
        """In a forked child: the sockets are the parent's connections too -- closed here
        without a shutdown (which would end them for the parent), never used."""
        socks = list(self._open)
        self._idle, self._open = [], {}
        self._lock = threading.Lock()  # a thread of the parent's may have held it at the fork
        for sock in socks:
            sock.close()

    @staticmethod
    def _read(reader: ResponseReader, chunk: bytes) -> Response | None:
        """One read's bytes into *reader*: the response once whole (the connection's end before
        that is a ``ConnectionResetError``)."""
        response = reader.feed(chunk) if chunk else reader.eof()
        if response is None and not chunk:
            raise ConnectionResetError("the server closed the connection")
        return response

    def _may_retry(self, request: Prepared, reused: bool, reader: ResponseReader, exc: BaseException) -> bool:
        """Whether *request* may go once more on a fresh connection after *exc*: it is idempotent
        and *exc* says only that a kept connection had been closed by the server (which, then, most
        likely never saw it; a request that is not idempotent is never sent twice)."""
        return request.idempotent and reused and not reader.started and isinstance(exc, ConnectionError) \
            and not self.closed

    def _done(self, sock: socket.socket, response: Response, doing: str, request: Prepared) -> Any:
        """Keep *sock* for the next request if it may carry one; *response*'s result (to *request*)."""
        if response.keep_alive and not self.closed and len(self._idle) < _MAX_IDLE:
            self._idle.append(sock)
        else:
            self._discard(sock)
        return result_of(response, doing, request)

    def _take_idle(self) -> socket.socket | None:
        """An idle connection still in step with the server, or None.  One with input waiting --
        the server closed it, or sent bytes nobody asked for -- is dropped here, before a
        request goes on it: the common "the server closed the kept connection" never costs a
        request that may not be sent twice."""
        while True:
            try:
                sock = self._idle.pop()  # atomic: no lock, and no check-then-pop race between threads
            except IndexError:
                return None
            watch = self._open.get(sock)
            if watch is not None and not watch.poll(0):
                return sock
            self._discard(sock)

    def _adopt(self, sock: socket.socket, doing: str) -> socket.socket:
        """A new connection, counted among ours (or closed, if we were closed meanwhile)."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one write: send it now
        with self._lock:
            if self.closed:
                sock.close()
                raise ClientClosed(f"{doing}: the client was closed")
            self._open[sock] = watch = select.poll()
        watch.register(sock, select.POLLIN)
        return sock

    def _discard(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)
        sock.close()

    def unavailable(self, doing: str, exc: BaseException, sent: bool = True) -> Error:
        """*exc*, met while *doing*, in tritonshm's terms.  Not *sent*: the request had not been
        wholly written (no connection, or it broke while writing), so the server cannot be
        running it -- said in the error's ``outcome`` (errors.OUTCOMES)."""
        if self.closed:
            return ClientClosed(f"{doing}: the client was closed")
        error: ServerError
        if isinstance(exc, (TimeoutError, BlockingIOError)):  # a kernel timeout (SO_RCVTIMEO) is EAGAIN
            error = ServerTimeout(f"{doing}: no answer from {self.host.decode()} within network_timeout="
                                  f"{self.endpoint.network_timeout} s")
        elif isinstance(exc, ValueError):
            error = ServerError(f"{doing}: the server's answer is not HTTP/1.1 as expected: {exc}")
        else:
            address = self.host.decode()
            error = ServerUnavailable(f"{doing}: cannot reach the Triton server at {address} ({exc})"
                                      f"{no_server_hint(address)}")
        error.outcome = Outcome.UNKNOWN if sent else Outcome.NOT_SENT
        return error


class Connections(_ConnectionsBase):
    """Blocking HTTP/1.1 connections to one server, used by whichever thread sends."""

    def send(self, request: Prepared, again: Callable[[], None] | None = None) -> Any:
        """Send *request*, read its answer: what :func:`result_of` makes of it.  ``again()`` is
        called before it goes out a second time (see :meth:`_may_retry`)."""
        doing = f"inferring with model {request.model!r}"
        pieces = request.wire(self.host)
        for attempt in range(2):
            sock = None if attempt else self._take_idle()  # the second try: a fresh connection
            reused = sock is not None
            if sock is None:
                sock = self._connect(doing)
            reader, response, sent = ResponseReader(), None, False
            try:
                for piece in pieces:
                    sock.sendall(piece)
                sent = True  # (a request not wholly written is never run: Triton reads it whole first)
                while response is None:
                    response = self._read(reader, sock.recv(reader.wanted()))
            except (OSError, ValueError) as exc:
                self._discard(sock)
                if self._may_retry(request, reused, reader, exc):
                    if again is not None:
                        again()
                    continue
                raise self.unavailable(doing, exc, sent) from exc
            return self._done(sock, response, doing, request)
        raise AssertionError("unreachable: the second try uses a fresh connection")

    def close(self) -> None:
        """Close every connection; requests on them end with :class:`ClientClosed`."""
        with self._lock:
            self.closed = True
            socks, self._open = list(self._open), {}
        self._idle.clear()
        for sock in socks:
            _shut(sock)

    def _connect(self, doing: str) -> socket.socket:
        if self.closed:
            raise ClientClosed(f"{doing}: the client was closed")
        endpoint = self.endpoint
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), endpoint.connection_timeout)
        except OSError as exc:
            raise self.unavailable(doing, exc, sent=False) from exc
        # The wait for an answer is the kernel's (SO_RCVTIMEO / SO_SNDTIMEO on a blocking socket,
        # EAGAIN when it runs out): a Python timeout would poll(2) before every send and receive.
        sock.settimeout(None)
        if endpoint.network_timeout is not None:
            wait = _timeval(endpoint.network_timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait)
        return self._adopt(sock, doing)


class AsyncConnections(_ConnectionsBase):
    """The same on an event loop: non-blocking sockets read and written by the loop."""

    async def send(self, request: Prepared, again: Callable[[], None] | None = None) -> Any:
        """Send *request*, read its answer (see :meth:`Connections.send`).  A task cancelled
        in the middle drops its connection: what is left of the answer is unread on it."""
        doing = f"inferring with model {request.model!r}"
        pieces = request.wire(self.host)
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            sock = None if attempt else self._take_idle()  # the second try: a fresh connection
            reused = sock is not None
            if sock is None:
                sock = await self._connect(loop, doing)
            reader, response, sent = ResponseReader(), None, False
            try:
                for piece in pieces:
                    await loop.sock_sendall(sock, piece)
                sent = True  # (a request not wholly written is never run: Triton reads it whole first)
                while response is None:
                    chunk = await asyncio.wait_for(loop.sock_recv(sock, reader.wanted()), self.endpoint.network_timeout)
                    response = self._read(reader, chunk)
            except (OSError, ValueError, asyncio.TimeoutError) as exc:
                if self._may_retry(request, reused, reader, exc):
                    if again is not None:
                        again()
                    continue
                raise self.unavailable(doing, exc, sent) from exc
            finally:
                if response is None:  # failed, or cancelled: what is left of the answer is unread on it
                    self._discard(sock)
            return self._done(sock, response, doing, request)
        raise AssertionError("unreachable: the second try uses a fresh connection")

    def close(self) -> None:
        """Close every connection; requests on them end with :class:`ClientClosed`.  A socket in
        use is only shut down here: that wakes the loop's reader, and the request closes it (a
        socket closed under a waiting reader would never wake it)."""
        self.closed = True
        idle, self._idle = self._idle, []
        for sock in idle:
            self._discard(sock)
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    async def _connect(self, loop: asyncio.AbstractEventLoop, doing: str) -> socket.socket:
        if self.closed:
            raise ClientClosed(f"{doing}: the client was closed")
        endpoint = self.endpoint
        try:
            infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, address = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, address), endpoint.connection_timeout)
            except BaseException:
                sock.close()
                raise
        except (OSError, asyncio.TimeoutError) as exc:
            raise self.unavailable(doing, exc, sent=False) from exc
        return self._adopt(sock, doing)


_ALL: "weakref.WeakSet[_ConnectionsBase]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for connections in list(_ALL):
        connections._forget_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` of *seconds* (at least a microsecond: zero would mean no limit)."""
    micros = max(round(seconds * 1e6), 1)
    return struct.pack("@ll", micros // 1_000_000, micros % 1_000_000)


def _shut(sock: socket.socket) -> None:
    """Wake whoever waits on *sock* (shutdown), then close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
