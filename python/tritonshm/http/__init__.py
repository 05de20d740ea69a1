"""``tritonclient.http`` with the tensors in shared memory: change the import line, keep the code.

    import tritonshm.http as httpclient      # was: import tritonclient.http as httpclient

Every public name of ``tritonclient.http`` is here, the very same object (``InferInput``,
``InferRequestedOutput``, ``InferResult``, ``InferAsyncRequest``, ``InferenceServerException``,
...), except :class:`InferenceServerClient`: tritonclient's class, subclassed.

Why a subclass rather than a wrapper holding one: every method it does not change -- health,
metadata, config, repository and model control, statistics, trace and log settings, the
shared-memory calls -- is tritonclient's own, with its signature,
defaults and behaviour, without a line here to keep in step with each release; and the client
still is a ``tritonclient.http.InferenceServerClient`` to the caller's type checks.  What it
adds -- the slot pools -- it *holds*: a :class:`tritonshm.Client` for the same server, made on the
first call that uses it.

What goes through shared memory (this release): :meth:`InferenceServerClient.infer`,
:meth:`InferenceServerClient.async_infer` (``InferAsyncRequest.get_result()``) and ``infer`` of
:mod:`tritonshm.http.aio`'s client.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import tritonclient.http as _tritonclient_http

from .. import _tritonclient_compat
from ..facade import _route

__all__ = _route.reexport(_tritonclient_http, globals(), own=("aio",))


#: tritonclient.http's ``InferInput``, whose ``set_data_from_numpy`` keeps the array rather
#: than a copy of its bytes (see :class:`tritonshm.facade._route.KeptInput`): a call through
#: the slots copies it once.  Everything else is tritonclient's.
InferInput = _tritonclient_compat.input_class(_route.HttpKeptInput, _tritonclient_http.InferInput,
                                           http=True, module=__name__)

#: The result of a call the slots carried: a ``tritonclient.http.InferResult``.
_SlotResult = _tritonclient_compat.result_class(_route.HttpSlotResult, _tritonclient_http.InferResult)


class _SlotAsyncRequest(_route.SlotAsyncRequest, _tritonclient_http.InferAsyncRequest):  # type: ignore[misc]
    """``async_infer``'s answer for a call the slots carried: a ``tritonclient.http.InferAsyncRequest``
    whose ``get_result`` waits on the held client's future (not on a greenlet)."""


class InferenceServerClient(_route.HeldSlots, _tritonclient_http.InferenceServerClient):  # type: ignore[misc]
    """tritonclient.http's client, whose :meth:`infer` moves the tensors through shared memory.

    Takes what tritonclient's takes (``url`` as ``"host:port"``, ``concurrency``,
    ``connection_timeout``, ``network_timeout``, ``ssl``, ...); every method but :meth:`infer`,
    :meth:`async_infer` and
    :meth:`close` is tritonclient's own.  ``unregister_system_shared_memory()`` with no name
    unregisters every region on the server, ours included, as tritonclient's does; the next
    :meth:`infer` finds its slots gone and registers them again before it runs.
    An error the server sends, and what ``verbose=True`` prints, read as tritonclient's (see
    docs/tritonclient.md for each feature).
    """

    _tritonshm_protocol = "http"
    _tritonshm_module = _tritonclient_http
    _tritonshm_input = InferInput
    _tritonshm_result = _SlotResult

    def infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
              request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
              sequence_end: bool = False, priority: int = 0, timeout: Any = None, headers: Any = None,
              query_params: Any = None, request_compression_algorithm: Any = None,
              response_compression_algorithm: Any = None, parameters: Any = None) -> Any:
        """tritonclient.http's ``infer``, its inputs and outputs in shared memory.

        Inputs given data with ``set_data_from_numpy`` (binary or JSON) are copied into one of
        this client's slots (the ``InferInput`` objects are left as they were), the server
        writes the outputs into the slot, and the result -- a ``tritonclient.http.InferResult``
        -- answers ``as_numpy``, ``get_output`` and ``get_response`` as tritonclient's would
        (each output as if sent in binary, its ``binary_data_size`` what it would have taken).
        A call the slots cannot carry exactly as tritonclient sends it (an input or output bound
        to shared memory by hand, no data, a name, datatype or shape the model does not take, a
        batch beyond ``max_batch_size``, a ``request_id``, ``query_params``, an output asked for
        as JSON (``binary_data=False``) or for classification) is tritonclient's own call: the
        tensors go on the wire, a mistake gets the server's own error.  Where the server cannot
        open our memory (another machine), every call goes on the wire, after one warning.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout, headers=headers,
                                 request_compression_algorithm=request_compression_algorithm,
                                 response_compression_algorithm=response_compression_algorithm,
                                 parameters=parameters)
        result = None if query_params is not None else self._tritonshm_slots.infer(
            self, model_name, inputs, model_version, outputs, request_id, options)
        if result is not None:
            return result
        return super().infer(model_name, inputs, model_version=model_version, outputs=outputs,
                             request_id=request_id, sequence_id=sequence_id, sequence_start=sequence_start,
                             sequence_end=sequence_end, priority=priority, timeout=timeout, headers=headers,
                             query_params=query_params, request_compression_algorithm=request_compression_algorithm,
                             response_compression_algorithm=response_compression_algorithm,
                             parameters=parameters)

    def async_infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
                    request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
                    sequence_end: bool = False, priority: int = 0, timeout: Any = None, headers: Any = None,
                    query_params: Any = None, request_compression_algorithm: Any = None,
                    response_compression_algorithm: Any = None, parameters: Any = None) -> Any:
        """tritonclient.http's ``async_infer``, its inputs and outputs in shared memory.

        Returns at once an ``InferAsyncRequest`` whose ``get_result(block=True, timeout=None)``
        answers as tritonclient's: the result (a ``tritonclient.http.InferResult``, as
        :meth:`infer`'s), the request's ``InferenceServerException``, or -- not answered within
        *timeout* seconds, or at once without *block* -- "failed to obtain inference response".
        The slots take the calls :meth:`infer`'s take, decided and their inputs read now, on the
        calling thread; the rest is tritonclient's own ``async_infer`` (tensors on the wire).
        Requests the slots take run on the held client's worker threads, ``concurrency`` (the
        constructor's) at a time in the order made, as tritonclient's: by default one at a time,
        so a sequence's steps reach the server in order.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout, headers=headers,
                                 request_compression_algorithm=request_compression_algorithm,
                                 response_compression_algorithm=response_compression_algorithm,
                                 parameters=parameters)
        pending = None if query_params is not None else self._tritonshm_slots.infer_async(
            self, model_name, inputs, model_version, outputs, request_id, options)
        if pending is None:
            return super().async_infer(model_name, inputs, model_version=model_version, outputs=outputs,
                                       request_id=request_id, sequence_id=sequence_id,
                                       sequence_start=sequence_start, sequence_end=sequence_end,
                                       priority=priority, timeout=timeout, headers=headers,
                                       query_params=query_params,
                                       request_compression_algorithm=request_compression_algorithm,
                                       response_compression_algorithm=response_compression_algorithm,
                                       parameters=parameters)
        return _SlotAsyncRequest(pending)


    def unregister_system_shared_memory(self, name: str = "", headers: Any = None, query_params: Any = None) -> None:
        """tritonclient.http's ``unregister_system_shared_memory``; with no *name*, a refusal for
        nothing but this client's slots a request runs on is no failure (see
        :meth:`~tritonshm.facade._route.SlotRoute.unregister`)."""
        self._tritonshm_slots.unregister(
            self, functools.partial(super().unregister_system_shared_memory, name, headers, query_params), name, headers)

_DEFAULTS = {name: parameter.default
             for name, parameter in inspect.signature(_tritonclient_http.InferenceServerClient.infer).parameters.items()}


def __getattr__(name: str) -> Any:
    """``tritonshm.http.aio`` without importing it first, as after ``import tritonclient.http.aio``
    (imported on first use: it costs what tritonclient's aio module costs)."""
    if name == "aio":
        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
