"""Streamed requests: one gRPC stream per client, many requests on it by id.

Decoupled models answer a request with any number of responses, over
gRPC's bidirectional ``ModelStreamInfer`` only.  A client keeps one stream
open (opened on first use, again after it broke) and multiplexes its
requests on it by request id, as tritonclient does.

What Triton 2.51 sends, and what this module relies on (the server's
``stream_infer_handler.cc``):

* every response carries its request's id -- an error too: the server
  "repopulates the id so that client knows which request failed";
* ``triton_final_response`` (a bool parameter) marks a request's last
  response; with ``triton_enable_empty_final_response`` the server sends an
  empty final response even when the model has nothing more to say;
* a request the server could not start gets one error response with the id
  and no parameters: that is its end.

tritonclient's stream callback drops the id of error responses, so the
stream is read at the protocol level here (its stub and its request
builder; both are tritonclient's own and pinned by its version).

:class:`StreamTable` is the sans-I/O core: which request each response
belongs to, and what runs once a request is over (its slot goes back --
see :meth:`Streamed.when_final`).  :class:`BlockingStream` (a reader
thread) and :class:`AsyncStream` (a reader task) carry it over the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import secrets
import threading
from typing import Any, Callable, NamedTuple

from .. import _tritonclient_compat
from ..errors import ClientClosed, ServerUnavailable, copy_for_another_caller, translate_error

__all__ = ["AsyncStream", "BlockingStream", "StreamResponse", "StreamTable", "Streamed", "open_kwargs",
           "request_message", "send_on_stream", "stream_key"]

FINAL = "triton_final_response"
_CLOSE_GRACE = 2.0  # seconds a closing client lets the server finish the streamed requests it runs


class StreamResponse(NamedTuple):
    """One response of a streamed request: tritonclient's result (None for an empty final
    response or an error), whether it is the request's last, and the error it carries."""

    result: Any
    final: bool
    error: BaseException | None = None


class Streamed:
    """One request on the stream: its id, where its responses go, and what runs at its end."""

    __slots__ = ("id", "inbox", "final", "answered", "_deliver", "_at_final")

    def __init__(self, request_id: str, inbox: Any, deliver: Callable[[StreamResponse], None]):
        self.id = request_id
        self.inbox = inbox          # the driver's queue of StreamResponses
        self.final = False          # its last response arrived (or the stream broke)
        self.answered = False       # final because the server said so (not because the stream ended)
        self._deliver = deliver
        self._at_final: list[Callable[[bool], None]] = []

    def when_final(self, callback: Callable[[bool], None]) -> None:
        """Run *callback* once this request is over for the client (now, if it is), telling it
        whether the server answered it to the end (True) or the stream ended first (False:
        the server may still be running it)."""
        with _table_lock:
            if not self.final:
                self._at_final.append(callback)
                return
        callback(self.answered)

    def _end(self, answered: bool) -> list[Callable[[bool], None]]:
        self.final = True
        self.answered = answered
        callbacks, self._at_final = self._at_final, []
        return callbacks


# Guards every table's entries and every entry's end (responses arrive on a reader thread).
_table_lock = threading.Lock()


class StreamTable:
    """The requests open on one stream, by id (sans-I/O): responses go to their request."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)   # ids unique across this client's streams
        self._ids = itertools.count(1)
        self._open: dict[str, Streamed] = {}
        self.broken: BaseException | None = None

    def open(self, inbox: Any, deliver: Callable[[StreamResponse], None], request_id: str = "") -> Streamed:
        """A new request on the stream, its responses handed to *deliver*; under *request_id*
        where one is given and no open request of the stream has it (the server, and the model,
        see the caller's id), else under an id of ours."""
        with _table_lock:
            if self.broken is not None:
                raise copy_for_another_caller(self.broken)
            if not request_id or request_id in self._open:
                request_id = f"tshm-{self._prefix}-{next(self._ids)}"
            entry = Streamed(request_id, inbox, deliver)
            self._open[entry.id] = entry
        return entry

    def dispatch(self, message: Any, wrap: Callable[[Any], Any]) -> None:
        """Hand one ``ModelStreamInferResponse`` to its request (*wrap* makes tritonclient's
        result of its ``infer_response``); unknown ids are dropped (a request abandoned
        and already ended)."""
        taken = self.take(message)
        if taken is None:
            return
        entry, final, at_final = taken
        response = message.infer_response
        if message.error_message:
            error = translate_error(Exception(message.error_message),
                                           f"streaming model {response.model_name!r}")
            entry._deliver(StreamResponse(None, final, error))
        else:
            entry._deliver(StreamResponse(wrap(response) if response.outputs or not final else None, final))
        for callback in at_final:
            callback(True)

    def take(self, message: Any) -> tuple[Streamed, bool, list[Callable[[bool], None]]] | None:
        """Which request one ``ModelStreamInferResponse`` belongs to (None: an unknown id) and
        whether it is that request's last; a last one ends the request, and what was to run
        at its end is returned, for the caller to run once the response is delivered
        (``callback(True)``)."""
        response = message.infer_response
        parameters = response.parameters
        final = parameters[FINAL].bool_param if FINAL in parameters else True  # no parameters: never started
        with _table_lock:
            entry = self._open.get(response.id)
            if entry is None:
                return None
            at_final: list[Callable[[bool], None]] = []
            if final:
                del self._open[response.id]
                at_final = entry._end(answered=True)
        return entry, final, at_final

    def fail_all(self, error: BaseException) -> None:
        """The stream is over (broken, or the client closed it): every open request ends with *error*."""
        with _table_lock:
            if self.broken is None:
                self.broken = error
            entries, self._open = list(self._open.values()), {}
            ended = [(entry, entry._end(answered=False)) for entry in entries]
        for entry, callbacks in ended:  # (each its own copy of the error: see copy_for_another_caller)
            entry._deliver(StreamResponse(None, True, copy_for_another_caller(error)))
            for callback in callbacks:
                callback(False)


def stream_key(options: Any) -> Any:
    """Which of a client's streams carries a request with *options* (their headers and
    compression belong to the stream)."""
    return None if options is None else options.stream_key


def request_message(model: str, version: str, inputs: list, outputs: list | None, request_id: str,
                    options: Any = None) -> Any:
    """The ``ModelInferRequest`` of one streamed request, asking for an empty final response."""
    kwargs = options.grpc_stream_infer_kwargs() if options is not None else {}
    message = _tritonclient_compat.grpc_request(
        model_name=model, inputs=inputs, model_version=version, request_id=request_id, outputs=outputs or None,
        **{"sequence_id": 0, "sequence_start": False, "sequence_end": False, "priority": 0, "timeout": None,
           "parameters": None, **kwargs})
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def send_on_stream(streams: dict[Any, Any], step: Any, make: Callable[[Any], Any]) -> Streamed:
    """Carry out a :class:`~._steps.StreamSend` for either driver: its request on the stream
    it names, else on the driver's stream for its options (*streams*, by :func:`stream_key`;
    *make* opens one for given options); its entry.  No I/O here: the stream's own thread (or
    task) sends.  The claim is unanswered from now on: the server may run the request."""
    if step.claim is not None:
        step.claim.unanswered = True
    stream = step.stream  # a stream of the caller's (tritonshm.grpc's), or the driver's own
    if stream is None:
        key = stream_key(step.options)
        stream = streams.get(key)
        if stream is None:
            stream = streams.setdefault(key, make(step.options))
    return stream.send(request_message(step.model, step.version, step.inputs, step.outputs, "", step.options))


def _start(client: Any, options: Any, messages: Any) -> Any:
    """Open a ``ModelStreamInfer`` call on tritonclient *client* (blocking or aio) that sends
    *messages* (an iterator, or an async one), with the stream's headers and compression."""
    try:
        return _tritonclient_compat.grpc_stub(client).ModelStreamInfer(messages, **open_kwargs(client, options))
    except Exception as exc:
        raise translate_error(exc, "opening an inference stream") from exc


def _stream_error(exc: BaseException) -> BaseException:
    """What a broken stream (a gRPC failure: the server gone, a deadline) is, in our terms."""
    import grpc

    if isinstance(exc, grpc.RpcError):
        exc = _tritonclient_compat.grpc_error(exc)
    return translate_error(exc, "reading the inference stream")


def _wrap_result(response: Any) -> Any:
    from tritonclient.grpc import InferResult

    return InferResult(response)


def open_kwargs(client: Any, options: Any) -> dict[str, Any]:
    """How a stream is opened on tritonclient *client* for requests with *options*: the gRPC
    metadata (headers) and compression that belong to the stream, not to a request."""
    given = options.grpc_start_stream_kwargs() if options is not None else {}
    return {"metadata": _tritonclient_compat.grpc_metadata(client, given.get("headers")),
            "compression": _tritonclient_compat.grpc_compression(given.get("compression_algorithm"))}


class BlockingStream:
    """The blocking client's stream: requests go in through a queue, a thread reads responses.

    *options* (those of its first request) give its headers and compression:
    requests with other ones go on a stream of their own (see ``stream_key``).
    """

    def __init__(self, connect: Callable[[], Any], options: Any = None):
        self._connect = connect
        self._options = options
        self._lock = threading.Lock()
        self._client: Any = None
        self._call: Any = None
        self._requests: queue.SimpleQueue | None = None
        self._table: StreamTable | None = None
        self._reader: threading.Thread | None = None
        self._closed = False

    def send(self, message: Any) -> Streamed:
        """Put *message* on the stream (opening it if needed); its entry, inbox a SimpleQueue."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            if self._table is None or self._table.broken is not None:
                self._open()
            table, requests = self._table, self._requests
            assert table is not None and requests is not None  # _open() set both
            entry = table.open(inbox, inbox.put)
            message.id = entry.id
            requests.put(message)
        return entry

    def _open(self) -> None:
        if self._client is None:
            self._client = self._connect()
        requests: queue.SimpleQueue = queue.SimpleQueue()
        table = StreamTable()

        def messages() -> Any:
            while True:
                message = requests.get()
                if message is None:
                    return
                yield message

        call = _start(self._client, self._options, messages())
        self._call, self._requests, self._table = call, requests, table
        self._reader = threading.Thread(target=self._read, args=(call, table), name="tritonshm-stream",
                                        daemon=True)
        self._reader.start()

    @staticmethod
    def _read(call: Any, table: StreamTable) -> None:
        try:
            for message in call:
                table.dispatch(message, _wrap_result)
            error: BaseException = ServerUnavailable("the server ended the inference stream")
        except Exception as exc:
            # Cancelled by close(): grpc's debug_error_string() (which tritonclient's error asks
            # for) never returns for a call cancelled under a reader; close() said what it is.
            error = ClientClosed("the client was closed while this stream was open") if call.cancelled() \
                else _stream_error(exc)
        table.fail_all(error)

    def close(self) -> None:
        """End the stream: requests still open end with :class:`ClientClosed`; idempotent."""
        with self._lock:
            self._closed = True
            call, requests, table, reader = self._call, self._requests, self._table, self._reader
            self._call = self._requests = self._table = self._reader = None
        # Half-close first and let the server finish what it runs (cancelling a gRPC stream
        # with requests in flight races in Triton before 2.57: server issues 7368 and 8034);
        # cancel only what is still open after a grace period.
        if requests is not None:
            requests.put(None)
        if reader is not None:
            reader.join(timeout=_CLOSE_GRACE)
        if table is not None:
            table.fail_all(ClientClosed("the client was closed while this stream was open"))
        if call is not None and reader is not None and reader.is_alive():
            call.cancel()
            reader.join(timeout=_CLOSE_GRACE)
        if self._client is not None:
            self._client.close()


class AsyncStream:
    """The asyncio client's stream: requests go in through an asyncio queue, a task reads responses
    (*options* as for :class:`BlockingStream`)."""

    def __init__(self, aio_client: Any, options: Any = None):
        self._client = aio_client
        self._options = options
        self._call: Any = None
        self._requests: asyncio.Queue | None = None
        self._table: StreamTable | None = None
        self._reader: asyncio.Task | None = None
        self._closed = False

    def send(self, message: Any) -> Streamed:
        """Put *message* on the stream (opening it if needed); its entry, inbox an asyncio.Queue."""
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._table is None or self._table.broken is not None:
            self._open()
        inbox: asyncio.Queue = asyncio.Queue()
        table, requests = self._table, self._requests
        assert table is not None and requests is not None  # _open() set both
        entry = table.open(inbox, inbox.put_nowait)
        message.id = entry.id
        requests.put_nowait(message)
        return entry

    def _open(self) -> None:
        requests: asyncio.Queue = asyncio.Queue()
        table = StreamTable()

        async def messages() -> Any:
            while True:
                message = await requests.get()
                if message is None:
                    return
                yield message

        call = _start(self._client, self._options, messages())
        self._call, self._requests, self._table = call, requests, table
        self._reader = asyncio.ensure_future(self._read(call, table))

    @staticmethod
    async def _read(call: Any, table: StreamTable) -> None:
        try:
            async for message in call:
                table.dispatch(message, _wrap_result)
            error: BaseException = ServerUnavailable("the server ended the inference stream")
        except asyncio.CancelledError:
            error = ClientClosed("the client was closed while this stream was open")
        except Exception as exc:
            error = _stream_error(exc)
        table.fail_all(error)

    async def close(self) -> None:
        """End the stream: requests still open end with :class:`ClientClosed`; idempotent."""
        self._closed = True
        call, requests, table, reader = self._call, self._requests, self._table, self._reader
        self._call = self._requests = self._table = self._reader = None
        if requests is not None:
            requests.put_nowait(None)  # half-close first, as BlockingStream.close does
        if reader is not None:
            await asyncio.wait([reader], timeout=_CLOSE_GRACE)
        if table is not None:
            table.fail_all(ClientClosed("the client was closed while this stream was open"))
        if call is not None and reader is not None and not reader.done():
            call.cancel()
            await asyncio.wait([reader], timeout=_CLOSE_GRACE)
