"""tritonclient.grpc's inference stream -- ``start_stream``, ``async_stream_infer``,
``stop_stream`` and the aio client's ``stream_infer`` -- with each request's inputs in the
facade's slots.

The stream is opened as tritonclient opens it (its stub, its metadata for *headers*, its
compression, ``stream_timeout``) and its callback hears what tritonclient's would, in the
order the server answers, on one reader thread (a reader task for aio): ``result`` a
``tritonclient.grpc.InferResult`` of the server's response (outputs travel in the responses,
as tritonclient's do: Triton writes every response of a request into the same output region
and waits for no reader), carrying the caller's ``request_id``; ``error`` an
``InferenceServerException`` of the server's message.

What differs is underneath.  Every request goes out under an id of ours and asks for the
server's empty final response, so that :class:`~tritonshm.client._stream.StreamTable` knows
which request each response belongs to (tritonclient's callback drops the id of an error) and
when the server is done with it: only then does its slot go back to its pool.  The caller's
id is put back on each response, and an empty final response the caller did not ask for
(``enable_empty_final_response``) is not passed on -- Triton does not send it then.  A request
the slots cannot carry exactly as tritonclient sends it (see :mod:`tritonshm.facade._route`)
goes on the same stream as tritonclient builds it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable, Mapping, NamedTuple, Sequence

from .. import _tritonclient_compat as compat
from ..client._stream import StreamTable, Streamed
from ..errors import ClientClosed, InferenceServerException, RegionNotRegistered, translate_error

__all__ = ["FacadeStream", "AioFacadeStream"]

_EMPTY_FINAL = "triton_enable_empty_final_response"


class _Asked(NamedTuple):
    """What the caller asked of one request: its own id (the server's too, where no request in
    flight on the stream has it: see :meth:`StreamSender.send`), and whether it wants the empty
    final response (the server is always asked for it)."""

    request_id: str
    empty_final: bool


class _Sent(NamedTuple):
    """A request on the stream: what its caller asked, and -- for one the slots carried, until
    its first response -- its message, to send again should the server have forgotten the
    slot's region (``unregister_system_shared_memory()`` of everything, a restart)."""

    asked: _Asked
    message: Any = None


class _Sender:
    """One request's way onto a stream: what the engine's ``StreamSend`` step sends on."""

    __slots__ = ("_stream", "_asked")

    def __init__(self, stream: "_StreamCore", asked: _Asked):
        self._stream = stream
        self._asked = asked

    def send(self, message: Any) -> Streamed:
        """Put *message* on the stream under an id of ours; its entry.  The message is kept
        until the first response: it names the slot (no tensor), and is sent again if the
        server forgot the slot's region."""
        return self._stream.send(message, self._asked, keep=True)


class _StreamCore:
    """What the blocking and the aio stream share: the table of requests, what each caller
    asked, and what one response becomes for the caller (sans-I/O).  A driver supplies
    :meth:`_check_open` and :meth:`_put`."""

    def __init__(self, route: Any) -> None:
        self._route = route
        self._verbose = bool(getattr(route, "verbose", False))  # the facade's: print as tritonclient's stream
        self._table = StreamTable()
        self._sent: dict[str, _Sent] = {}  # the requests the server has not ended, by our id
        self._lock = threading.Lock()
        # Half-closing waits for every request's end: one the server refused for a region it
        # forgot is sent again on this stream (see :meth:`answer`).
        self._closing = False
        self._half_closed = False

    def request(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
                outputs: Sequence[Any] | None, request_id: str, empty_final: bool,
                options: Mapping[str, Any]) -> None:
        """Send one request (``async_stream_infer``'s arguments): its inputs in a slot, or as
        tritonclient builds it where the slots cannot carry them."""
        asked = _Asked(request_id, bool(empty_final))
        if self._route.stream_to(_Sender(self, asked), facade, model_name, inputs, model_version, outputs,
                                 request_id, options) is None:
            self.send_as_built(model_name, inputs, model_version, outputs, asked, options)

    def send_as_built(self, model_name: str, inputs: Sequence[Any], model_version: str,
                      outputs: Sequence[Any] | None, asked: _Asked, options: Mapping[str, Any]) -> None:
        """Send the request as tritonclient builds it (its tensors in the message)."""
        message = compat.grpc_request(model_name=model_name, inputs=inputs, model_version=model_version,
                                      request_id=asked.request_id, outputs=outputs,
                                      **{**_REQUEST_DEFAULTS, **options})
        self.send(message, asked)

    def send(self, message: Any, asked: _Asked, keep: bool = False, again: bool = False) -> Streamed:
        """Put *message* on the stream under the caller's request id where no request of the
        stream in flight has it (else under an id of ours: responses are told apart by id),
        asking for the server's empty final response (so the table knows when the server is
        done with it); its entry.
        With *keep*, the message is kept until its first response (see :class:`_Sent`).  A
        request sent *again* (:meth:`resent`) is not printed again."""
        self._check_open()
        if self._verbose and not again:
            self._print_request(message, asked)
        message.parameters[_EMPTY_FINAL].bool_param = True
        entry = self._table.open(None, _undelivered, asked.request_id)
        with self._lock:
            self._sent[entry.id] = _Sent(asked, message if keep else None)
        message.id = entry.id
        self._put(message)
        return entry

    def _check_open(self) -> None:
        raise NotImplementedError

    def _put(self, message: Any) -> None:
        raise NotImplementedError

    def _print_request(self, message: Any, asked: _Asked) -> None:
        """A verbose stream's request, as tritonclient's stream prints it (the aio one prints none)."""

    def answer(self, message: Any) -> tuple[tuple[Any, Any] | None, list[Callable[[bool], None]], _Sent | None]:
        """What one ``ModelStreamInferResponse`` is for the caller -- ``(result, error)`` as
        tritonclient's callback hears them, or None for an empty final response not asked
        for -- and what is to run once it was delivered (the request's end: its slot back).

        Third, a request to send again (else None): one the slots carried that the server
        refused, before anything else answered it, for a region it does not know -- tritonclient
        uses no region to forget.  The caller hears nothing of it yet: the driver registers the
        regions again and sends it once more (:meth:`send_again`), as the held client does for
        its own requests."""
        taken = self._table.take(message)
        if taken is None:
            return None, [], None  # not one of ours: never sent on this stream
        entry, final, at_final = taken
        with self._lock:
            sent = self._sent.pop(entry.id) if final else self._sent[entry.id]
            if not final and sent.message is not None:
                self._sent[entry.id] = sent._replace(message=None)  # answered: never sent again
        if message.error_message and final and sent.message is not None and _region_forgotten(message.error_message):
            return None, at_final, sent
        return self._heard(message, entry.id, sent.asked, final), at_final, None

    def _heard(self, message: Any, our_id: str, asked: _Asked, final: bool) -> tuple[Any, Any] | None:
        response = message.infer_response
        response.id = asked.request_id
        if message.error_message:
            # The server names the request in its errors: by the caller's id, as it would have.
            message.error_message = message.error_message.replace(
                f"[request id: {our_id}]", f"[request id: {asked.request_id or '<id_unknown>'}]")
            if self._verbose:
                print(message)
            return None, InferenceServerException(msg=message.error_message)
        if final and not response.outputs and not asked.empty_final:
            return None
        if self._verbose:  # (as the caller would have had it: its id, the final response it asked for)
            print(message)
        _, result_type, _ = compat.grpc_parts()
        return result_type(response), None

    def resent(self, sent: _Sent, at_final: list[Callable[[bool], None]], refusal: Any,
               failure: BaseException | None) -> tuple[tuple[Any, Any] | None, list[Callable[[bool], None]]]:
        """After :meth:`answer` asked for *sent* to go again (the regions registered again, or
        *failure* doing so): send it under a new id of ours, its slot held until that one ends
        (*at_final* moves to it); what the caller hears now -- nothing, or, where it could
        not go again, the server's *refusal* -- and what is to run then."""
        if failure is None:
            again = type(sent.message)()
            again.CopyFrom(sent.message)
            try:
                entry = self.send(again, sent.asked, again=True)  # not kept: sent again once only
            except InferenceServerException:
                pass  # the stream is no longer usable: the caller hears the refusal
            else:
                for callback in at_final:
                    entry.when_final(callback)
                return None, []
        return self._heard(refusal, refusal.infer_response.id, sent.asked, True), at_final

    def end(self, error: BaseException) -> None:
        """The stream is over: requests still open end unanswered (their slots wait for the
        server to let go of them)."""
        self._table.fail_all(error)
        with self._lock:
            self._sent.clear()

    def half_close_due(self, closing: bool = False) -> bool:
        """Whether the stream is to be half-closed now, once (*closing*: the caller is done
        sending): when the caller is done and the server has ended every request."""
        with self._lock:
            self._closing = self._closing or closing
            due = self._closing and not self._sent and not self._half_closed
            self._half_closed = self._half_closed or due
        return due


def _undelivered(response: Any) -> None:
    """An entry's deliver: never called (responses are read with ``StreamTable.take``)."""


def _region_forgotten(error_message: str) -> bool:
    """Whether the server's error says it does not know a shared-memory region (errors.py's
    table: :class:`~tritonshm.errors.RegionNotRegistered`)."""
    return isinstance(translate_error(Exception(error_message), "streaming"), RegionNotRegistered)


def regions_named(message: Any) -> set[str]:
    """The shared-memory regions a ``ModelInferRequest`` names."""
    return {tensor.parameters["shared_memory_region"].string_param
            for tensor in (*message.inputs, *message.outputs) if "shared_memory_region" in tensor.parameters}


#: tritonclient's request builder's arguments at async_stream_infer's defaults.
_REQUEST_DEFAULTS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False, "priority": 0,
                     "timeout": None, "parameters": None}


def stream_error(rpc_error: Any) -> InferenceServerException:
    """What tritonclient's stream callback hears when the gRPC stream fails: its cancelled
    error, or its translation of a gRPC status."""
    grpc, _, _ = compat.grpc_parts()
    if rpc_error.code() == grpc.StatusCode.CANCELLED:
        return InferenceServerException(msg=rpc_error.details() or "Locally cancelled by application!",
                                        status="StatusCode.CANCELLED")
    return compat.grpc_error(rpc_error)


class FacadeStream(_StreamCore):
    """tritonshm.grpc's stream: between ``start_stream`` and ``stop_stream``.

    *callback* is called as tritonclient calls it, ``callback(result=..., error=...)``, for
    each response in the order the server sends them, on the stream's reader thread.
    """

    def __init__(self, facade: Any, route: Any, callback: Callable[..., Any], stream_timeout: Any,
                 headers: Any, compression_algorithm: Any):
        super().__init__(route)
        self._callback = callback
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._active = True
        grpc, _, _ = compat.grpc_parts()
        try:
            self._call = compat.grpc_stub(facade).ModelStreamInfer(
                iter(self._requests.get, None), metadata=compat.grpc_metadata(facade, headers),
                timeout=stream_timeout, compression=compat.grpc_compression(compression_algorithm))
        except grpc.RpcError as rpc_error:
            compat.raise_grpc_error(rpc_error)
        self._reader = threading.Thread(target=self._read, name="tritonshm-facade-stream", daemon=True)
        self._reader.start()
        if self._verbose:
            print("stream started...")

    def _print_request(self, message: Any, asked: _Asked) -> None:
        # As the caller built it: its id, the empty final response only if it asked for it.
        shown = type(message)()
        shown.CopyFrom(message)
        shown.id = asked.request_id
        if asked.empty_final:
            shown.parameters[_EMPTY_FINAL].bool_param = True
        elif _EMPTY_FINAL in shown.parameters:  # (the held client asks for it on every request)
            del shown.parameters[_EMPTY_FINAL]
        print("async_stream_infer\n{}".format(shown))
        print("enqueued request {} to stream...".format(asked.request_id))

    def _check_open(self) -> None:
        if not self._active:
            raise InferenceServerException(msg="The stream is no longer in valid state, the error detail is reported "
                                           "through provided callback. A new stream should be started after "
                                           "stopping the current stream.")

    def _put(self, message: Any) -> None:
        self._requests.put(message)

    def _read(self) -> None:
        grpc, _, _ = compat.grpc_parts()
        ended: BaseException = ClientClosed("the inference stream ended")
        try:
            for message in self._call:
                answer, at_final, again = self.answer(message)
                if again is not None:  # refused for a region the server forgot: registered again, resent
                    try:
                        self._route.heal(regions_named(again.message))
                    except Exception as failure:
                        answer, at_final = self.resent(again, at_final, message, failure)
                    else:
                        answer, at_final = self.resent(again, at_final, message, None)
                try:
                    if answer is not None:
                        result, error = answer
                        self._callback(result=result, error=error)
                finally:
                    for callback in at_final:
                        callback(True)
                if self.half_close_due():
                    self._requests.put(None)
        except grpc.RpcError as rpc_error:
            # As tritonclient: the stream may still be usable (is_active); the caller is told once.
            self._active = self._call.is_active()
            ended = stream_error(rpc_error)
            self.end(ended)  # first: what the server was sent is accounted for before the caller hears
            self._callback(result=None, error=ended)
        finally:  # (a callback that raised ends the reading, as tritonclient's thread ends)
            self.end(ended)

    def close(self, cancel_requests: bool = False) -> None:
        """``stop_stream``: with *cancel_requests*, cancel the requests in flight; else wait
        until the server has answered every one (tritonclient's behaviour).  Requests the
        server may still run keep their slots until it lets go of them."""
        if cancel_requests:
            self._call.cancel()
        elif self.half_close_due(closing=True):
            self._requests.put(None)  # half-close: the server ends the stream once it is done
        # (else the reader half-closes once the server ended every request: one refused for a
        # region it forgot may still go again)
        if self._reader is not threading.current_thread():
            self._reader.join()
            if self._verbose:
                print("stream stopped...")


class AioFacadeStream(_StreamCore):
    """tritonshm.grpc.aio's ``stream_infer``: an async iterator of ``(result, error)`` for the
    requests *requests* yields (an async iterator of dicts of ``async_stream_infer``'s keyword
    arguments), with ``cancel()``, as tritonclient's.  Must be made in a running event loop."""

    def __init__(self, facade: Any, route: Any, requests: AsyncIterator[Mapping[str, Any]], stream_timeout: Any,
                 headers: Any, compression_algorithm: Any):
        super().__init__(route)
        self._facade = facade
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._failure: BaseException | None = None
        self._call = compat.grpc_stub(facade).ModelStreamInfer(
            self._messages(), metadata=compat.grpc_metadata(facade, headers), timeout=stream_timeout,
            compression=compat.grpc_compression(compression_algorithm))
        self._feeder = asyncio.ensure_future(self._feed(requests))

    async def _feed(self, requests: AsyncIterator[Mapping[str, Any]]) -> None:
        """Send each request *requests* yields, checked as tritonclient's request iterator
        checks them; then half-close the stream.  A failure is raised by the iterator."""
        try:
            async for given in requests:
                await self._send_given(given)
        except Exception as failure:
            self._failure = failure
        finally:
            if self.half_close_due(closing=True):
                self._outbox.put_nowait(None)

    async def _send_given(self, given: Any) -> None:
        if type(given) is not dict:
            raise InferenceServerException(msg="inputs_iterator is not yielding a dict")
        if "model_name" not in given or "inputs" not in given:
            raise InferenceServerException(
                msg="model_name and/or inputs is missing from inputs_iterator's yielded dict")
        model_name, inputs = given["model_name"], given["inputs"]
        version, outputs = given.get("model_version", ""), given.get("outputs")
        if type(version) is not str:
            raise InferenceServerException(msg="model_version must be a string")
        # tritonclient.grpc.aio reads these keys and ignores any other (enable_empty_final_response too)
        options = {name: given[name] for name in _REQUEST_DEFAULTS
                   if name in given and given[name] is not _REQUEST_DEFAULTS[name]}
        asked = _Asked(given.get("request_id", ""), False)
        if await self._route.stream_to_aio(_Sender(self, asked), self._facade, model_name, inputs, version,
                                           outputs, asked.request_id, options) is None:
            self.send_as_built(model_name, inputs, version, outputs, asked, options)

    async def _messages(self) -> AsyncIterator[Any]:
        while True:
            message = await self._outbox.get()
            if message is None:
                return
            yield message

    def _check_open(self) -> None:
        pass  # a failed stream ends the iterator (its error raised there), as tritonclient's

    def _put(self, message: Any) -> None:
        self._outbox.put_nowait(message)

    def __aiter__(self) -> "AioFacadeStream":
        return self

    async def __anext__(self) -> tuple[Any, Any]:
        while True:
            try:
                message = await self._call.__aiter__().__anext__()
            except StopAsyncIteration:
                self.end(ClientClosed("the inference stream ended"))
                if self._failure is not None:
                    raise self._failure from None
                raise
            except BaseException as failure:
                self.end(ClientClosed(f"the inference stream ended: {failure!r}"))
                raise
            answer, at_final, again = self.answer(message)
            if again is not None:  # refused for a region the server forgot: registered again, resent
                try:
                    await self._route.heal_aio(regions_named(again.message))
                except Exception as failure:
                    answer, at_final = self.resent(again, at_final, message, failure)
                else:
                    answer, at_final = self.resent(again, at_final, message, None)
            for callback in at_final:
                callback(True)
            if self.half_close_due():
                self._outbox.put_nowait(None)
            if answer is not None:
                return answer

    def cancel(self) -> bool:
        """Cancel the stream (its requests in flight), as tritonclient's iterator's ``cancel()``."""
        self._feeder.cancel()
        return bool(self._call.cancel())
