"""``tritonclient.grpc`` with the tensors in shared memory: change the import line, keep the code.

    import tritonshm.grpc as grpcclient      # was: import tritonclient.grpc as grpcclient

Every public name of ``tritonclient.grpc`` is here, the very same object (``InferInput``,
``InferRequestedOutput``, ``InferResult``, ``InferenceServerException``, ``KeepAliveOptions``,
``service_pb2``, ...), except :class:`InferenceServerClient`: tritonclient's class, subclassed.

Why a subclass rather than a wrapper holding one: every method it does not change -- health,
metadata, config, repository and model control, statistics, trace and log settings, the
shared-memory calls, ``async_infer``, streams -- is tritonclient's own, with its signature,
defaults and behaviour, without a line here to keep in step with each release; and the client
still is a ``tritonclient.grpc.InferenceServerClient`` to the caller's type checks.  What it
adds -- the slot pools -- it *holds*: a :class:`tritonshm.Client` for the same server, made on the
first call that uses it.

What goes through shared memory: the tensors of :meth:`InferenceServerClient.infer` and
:meth:`InferenceServerClient.async_infer`, and the inputs of the stream's requests
(``start_stream`` / ``async_stream_infer`` / ``stop_stream``; their outputs travel in the
responses, as tritonclient's do); the same in :mod:`tritonshm.grpc.aio` (``infer``,
``stream_infer``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import tritonclient.grpc as _tritonclient_grpc

from .. import _tritonclient_compat
from ..errors import InferenceServerException
from ..facade import _route, _stream

__all__ = _route.reexport(_tritonclient_grpc, globals(), own=("aio",))


#: tritonclient.grpc's ``InferInput``, whose ``set_data_from_numpy`` keeps the array rather
#: than a copy of its bytes (see :class:`tritonshm.facade._route.KeptInput`): a call through
#: the slots copies it once.  Everything else is tritonclient's.
InferInput = _tritonclient_compat.input_class(_route.GrpcKeptInput, _tritonclient_grpc.InferInput,
                                           http=False, module=__name__)

#: gRPC calls whose inputs take fewer bytes go inline, as tritonclient sends them (see
#: ``InferenceServerClient.tritonshm_inline_bytes``): the crossover measured lies between 64 and
#: 256 KiB.
_INLINE_BYTES = 128 << 10

#: The result of a call the slots carried: a ``tritonclient.grpc.InferResult``.
_SlotResult = _tritonclient_compat.result_class(_route.GrpcSlotResult, _tritonclient_grpc.InferResult)


class InferenceServerClient(_route.HeldSlots, _tritonclient_grpc.InferenceServerClient):  # type: ignore[misc]
    """tritonclient.grpc's client, whose :meth:`infer` moves the tensors through shared memory.

    Takes what tritonclient's takes (``url`` as ``"host:port"``, ``ssl``, ``creds``,
    ``keepalive_options``, ``channel_args``, ...); every method but :meth:`infer`,
    :meth:`async_infer`, the stream's (:meth:`start_stream`, :meth:`async_stream_infer`,
    :meth:`stop_stream`) and :meth:`close` is tritonclient's own.
    ``unregister_system_shared_memory()`` with no name
    unregisters every region on the server, ours included, as tritonclient's does; the next
    :meth:`infer` finds its slots gone and registers them again before it runs, and a stream's
    request the server refuses for that is sent again, once its slots are registered again.
    An error the server sends, and what ``verbose=True`` prints, read as tritonclient's (see
    docs/tritonclient.md for each feature).
    """

    _tritonshm_protocol = "grpc"
    _tritonshm_module = _tritonclient_grpc
    _tritonshm_input = InferInput
    _tritonshm_result = _SlotResult
    tritonshm_inline_bytes = _INLINE_BYTES

    def infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
              request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
              sequence_end: bool = False, priority: int = 0, timeout: Any = None,
              client_timeout: Any = None, headers: Any = None, compression_algorithm: Any = None,
              parameters: Any = None) -> Any:
        """tritonclient.grpc's ``infer``, its inputs and outputs in shared memory.

        Inputs given data with ``set_data_from_numpy`` are copied into one of this client's slots
        (the ``InferInput`` objects are left as they were), the server writes the outputs into
        the slot, and the result -- a ``tritonclient.grpc.InferResult`` -- answers
        ``as_numpy``, ``get_output`` and ``get_response`` as tritonclient's would.  A call the
        slots cannot carry exactly as tritonclient sends it (an input or output bound to shared
        memory by hand, no data, a name, datatype or shape the model does not take, a batch
        beyond ``max_batch_size``, a ``request_id``, classification) is tritonclient's own call:
        the tensors go on the wire, a mistake gets the server's own error.  Where the server
        cannot open our memory (another machine), every call goes on the wire, after one warning.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout,
                                 client_timeout=client_timeout, headers=headers,
                                 compression_algorithm=compression_algorithm, parameters=parameters)
        result = self._tritonshm_slots.infer(self, model_name, inputs, model_version, outputs, request_id,
                                             options)
        if result is not None:
            return result
        return super().infer(model_name, inputs, model_version=model_version, outputs=outputs,
                             request_id=request_id, sequence_id=sequence_id, sequence_start=sequence_start,
                             sequence_end=sequence_end, priority=priority, timeout=timeout,
                             client_timeout=client_timeout, headers=headers,
                             compression_algorithm=compression_algorithm, parameters=parameters)

    def async_infer(self, model_name: str, inputs: Any, callback: Any, model_version: str = "",
                    outputs: Any = None, request_id: str = "", sequence_id: Any = 0,
                    sequence_start: bool = False, sequence_end: bool = False, priority: int = 0,
                    timeout: Any = None, client_timeout: Any = None, headers: Any = None,
                    compression_algorithm: Any = None, parameters: Any = None) -> Any:
        """tritonclient.grpc's ``async_infer``, its inputs and outputs in shared memory.

        Returns at once; ``callback(result=..., error=...)`` is called once the request is done,
        on another thread, as tritonclient calls it: *result* a ``tritonclient.grpc.InferResult``
        (as :meth:`infer`'s) and *error* None, or *result* None and *error* the
        ``InferenceServerException``.  The returned context's ``cancel()`` cancels the request
        (the callback hears ``StatusCode.CANCELLED``).  The slots take the calls :meth:`infer`'s
        take, decided and their inputs read now, on the calling thread; the rest is
        tritonclient's own ``async_infer`` (tensors on the wire).  Requests run on the held
        client's worker threads, as many at once as it has slots.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout,
                                 client_timeout=client_timeout, headers=headers,
                                 compression_algorithm=compression_algorithm, parameters=parameters)
        pending = self._tritonshm_slots.infer_async(self, model_name, inputs, model_version, outputs, request_id,
                                                    options)
        if pending is None:
            return super().async_infer(model_name, inputs, callback, model_version=model_version, outputs=outputs,
                                       request_id=request_id, sequence_id=sequence_id,
                                       sequence_start=sequence_start, sequence_end=sequence_end,
                                       priority=priority, timeout=timeout, client_timeout=client_timeout,
                                       headers=headers, compression_algorithm=compression_algorithm,
                                       parameters=parameters)
        pending.add_done_callback(functools.partial(_route.answer_callback, callback))
        return _route.SlotCallContext(pending)


    # -- the stream: its requests' inputs in the slots too ------------------

    def start_stream(self, callback: Any, stream_timeout: Any = None, headers: Any = None,
                     compression_algorithm: Any = None) -> None:
        """tritonclient.grpc's ``start_stream``: opens the client's one gRPC stream, whose
        requests (:meth:`async_stream_infer`) have their inputs in this client's slots.

        ``callback(result=..., error=...)`` hears each response as tritonclient's does, in the
        order the server sends them, on the stream's own thread; *stream_timeout*, *headers*
        and *compression_algorithm* are tritonclient's.
        """
        if self._stream is not None or getattr(self, "_tritonshm_stream", None) is not None:
            raise InferenceServerException(msg="cannot start another stream with one already running. "
                                           "'InferenceServerClient' supports only a single active stream at a "
                                           "given time.")
        self._tritonshm_stream: _stream.FacadeStream | None = _stream.FacadeStream(
            self, self._tritonshm_slots, callback, stream_timeout, headers, compression_algorithm)

    def async_stream_infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
                           request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
                           sequence_end: bool = False, enable_empty_final_response: bool = False,
                           priority: int = 0, timeout: Any = None, parameters: Any = None) -> None:
        """tritonclient.grpc's ``async_stream_infer``: one request on the stream, its inputs
        copied into a slot (held until the server's last response to it), its outputs in
        the responses as tritonclient's are.

        A request the slots cannot carry exactly as tritonclient sends it (see :meth:`infer`)
        goes on the same stream as tritonclient builds it.  Waits for a free slot when all
        are in use (up to the held client's ``slot_timeout``): call it from the callback's
        thread only while slots are free.
        """
        stream = getattr(self, "_tritonshm_stream", None)
        if stream is None:
            raise InferenceServerException(msg="stream not available, use start_stream() to make one available.")
        if type(model_version) is not str:
            raise InferenceServerException(msg="model version must be a string")
        options = _route.changed(_STREAM_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout,
                                 parameters=parameters)
        stream.request(self, model_name, inputs, model_version, outputs, request_id, enable_empty_final_response,
                       options)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        """tritonclient.grpc's ``stop_stream``: waits until the server has answered every request
        on the stream, or with *cancel_requests* cancels them.  A request the server may still
        run keeps its slot until the server lets go of it."""
        stream, self._tritonshm_stream = getattr(self, "_tritonshm_stream", None), None
        if stream is not None:
            stream.close(cancel_requests)
        super().stop_stream(cancel_requests)

    def unregister_system_shared_memory(self, name: str = "", headers: Any = None, client_timeout: Any = None) -> None:
        """tritonclient.grpc's ``unregister_system_shared_memory``; with no *name*, a refusal for
        nothing but this client's slots a request runs on is no failure (see
        :meth:`~tritonshm.facade._route.SlotRoute.unregister`)."""
        self._tritonshm_slots.unregister(
            self, functools.partial(super().unregister_system_shared_memory, name, headers, client_timeout), name, headers)

    def close(self) -> None:
        """Stop the stream as tritonclient's ``close`` does (waiting for its requests), then
        unregister and unlink this client's slots and close the client."""
        self.stop_stream()
        super().close()


_DEFAULTS = {name: parameter.default
             for name, parameter in inspect.signature(_tritonclient_grpc.InferenceServerClient.infer).parameters.items()}
_STREAM_DEFAULTS = {name: parameter.default for name, parameter
                    in inspect.signature(_tritonclient_grpc.InferenceServerClient.async_stream_infer).parameters.items()}


def __getattr__(name: str) -> Any:
    """``tritonshm.grpc.aio`` without importing it first, as after ``import tritonclient.grpc.aio``
    (imported on first use: it costs what tritonclient's aio module costs)."""
    if name == "aio":
        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
