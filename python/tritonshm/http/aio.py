"""``tritonclient.http.aio`` with the tensors in shared memory: change the import line, keep the code.

    import tritonshm.http.aio as httpclient      # was: import tritonclient.http.aio as httpclient

Every public name of ``tritonclient.http.aio`` is here, the very same object, except
:class:`InferenceServerClient`: tritonclient's aio class, subclassed (why: see
:mod:`tritonshm.http`), whose ``await infer(...)`` moves the tensors through the slot pools of a
held :class:`tritonshm.aio.Client`, made on the first call that uses them.  Every other method is
tritonclient's own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import tritonclient.http.aio as _tritonclient_http_aio

from ..facade import _route
from . import InferInput as _KeptInput, _SlotResult

__all__ = _route.reexport(_tritonclient_http_aio, globals())
InferInput = _KeptInput  # the blocking module's: set_data_from_numpy keeps the array



class InferenceServerClient(_route.AioHeldSlots, _tritonclient_http_aio.InferenceServerClient):  # type: ignore[misc]
    """tritonclient.http.aio's client, whose :meth:`infer` moves the tensors through shared memory.

    Takes what tritonclient's takes (``url`` as ``"host:port"``, ``conn_limit``,
    ``conn_timeout``, ``ssl``, ``ssl_context``); every method but :meth:`infer` and :meth:`close`
    is tritonclient's own.  The slots are a :class:`tritonshm.aio.Client` for the same server.
    """

    _tritonshm_protocol = "http"
    _tritonshm_module = _tritonclient_http_aio
    _tritonshm_input = _KeptInput
    _tritonshm_result = _SlotResult

    async def infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
                    request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
                    sequence_end: bool = False, priority: int = 0, timeout: Any = None, headers: Any = None,
                    query_params: Any = None, request_compression_algorithm: Any = None,
                    response_compression_algorithm: Any = None, parameters: Any = None) -> Any:
        """tritonclient.http.aio's ``infer``, its inputs and outputs in shared memory.

        Carries what :meth:`tritonshm.http.InferenceServerClient.infer` carries, the same way
        (the rest is tritonclient's own ``infer``, on the wire), without blocking the event loop;
        requests awaited together run at once, each in a slot of its own.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout, headers=headers,
                                 request_compression_algorithm=request_compression_algorithm,
                                 response_compression_algorithm=response_compression_algorithm,
                                 parameters=parameters)
        result = None if query_params is not None else await self._tritonshm_slots.infer_aio(
            self, model_name, inputs, model_version, outputs, request_id, options)
        if result is not None:
            return result
        return await super().infer(model_name, inputs, model_version=model_version, outputs=outputs,
                                   request_id=request_id, sequence_id=sequence_id, sequence_start=sequence_start,
                                   sequence_end=sequence_end, priority=priority, timeout=timeout, headers=headers,
                                   query_params=query_params,
                                   request_compression_algorithm=request_compression_algorithm,
                                   response_compression_algorithm=response_compression_algorithm,
                                   parameters=parameters)


    async def unregister_system_shared_memory(self, name: str = "", headers: Any = None,
                                              query_params: Any = None) -> None:
        """tritonclient.http.aio's ``unregister_system_shared_memory``; with no *name*, a refusal for
        nothing but this client's slots a request runs on is no failure (see
        :meth:`~tritonshm.facade._route.SlotRoute.unregister`)."""
        await self._tritonshm_slots.unregister_aio(
            self, functools.partial(super().unregister_system_shared_memory, name, headers, query_params), name, headers)

_DEFAULTS = {name: parameter.default
             for name, parameter in inspect.signature(_tritonclient_http_aio.InferenceServerClient.infer).parameters.items()}
