"""``tritonclient.grpc.aio`` with the tensors in shared memory: change the import line, keep the code.

    import tritonshm.grpc.aio as grpcclient      # was: import tritonclient.grpc.aio as grpcclient

Every public name of ``tritonclient.grpc.aio`` is here, the very same object, except
:class:`InferenceServerClient`: tritonclient's aio class, subclassed (why: see
:mod:`tritonshm.grpc`), whose ``await infer(...)`` moves the tensors through the slot pools of a
held :class:`tritonshm.aio.Client`, made on the first call that uses them.  ``stream_infer``'s requests have their inputs in the slots too (outputs in the responses);
every other method is tritonclient's own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import tritonclient.grpc.aio as _tritonclient_grpc_aio

from ..facade import _route, _stream
from . import _INLINE_BYTES, InferInput as _KeptInput, _SlotResult

__all__ = _route.reexport(_tritonclient_grpc_aio, globals())
InferInput = _KeptInput  # the blocking module's: set_data_from_numpy keeps the array



class InferenceServerClient(_route.AioHeldSlots, _tritonclient_grpc_aio.InferenceServerClient):  # type: ignore[misc]
    """tritonclient.grpc.aio's client, whose :meth:`infer` moves the tensors through shared memory.

    Takes what tritonclient's takes; every method but :meth:`infer`, :meth:`stream_infer`
    and :meth:`close` is tritonclient's own.  The slots are a :class:`tritonshm.aio.Client` for the same server.
    """

    _tritonshm_protocol = "grpc"
    _tritonshm_module = _tritonclient_grpc_aio
    _tritonshm_input = _KeptInput
    _tritonshm_result = _SlotResult
    tritonshm_inline_bytes = _INLINE_BYTES  # as the blocking client's

    async def infer(self, model_name: str, inputs: Any, model_version: str = "", outputs: Any = None,
                    request_id: str = "", sequence_id: Any = 0, sequence_start: bool = False,
                    sequence_end: bool = False, priority: int = 0, timeout: Any = None,
                    client_timeout: Any = None, headers: Any = None, compression_algorithm: Any = None,
                    parameters: Any = None) -> Any:
        """tritonclient.grpc.aio's ``infer``, its inputs and outputs in shared memory.

        Carries what :meth:`tritonshm.grpc.InferenceServerClient.infer` carries, the same way
        (the rest is tritonclient's own ``infer``, on the wire), without blocking the event loop;
        requests awaited together run at once, each in a slot of its own.
        """
        options = _route.changed(_DEFAULTS, sequence_id=sequence_id, sequence_start=sequence_start,
                                 sequence_end=sequence_end, priority=priority, timeout=timeout,
                                 client_timeout=client_timeout, headers=headers,
                                 compression_algorithm=compression_algorithm, parameters=parameters)
        result = await self._tritonshm_slots.infer_aio(self, model_name, inputs, model_version, outputs,
                                                       request_id, options)
        if result is not None:
            return result
        return await super().infer(model_name, inputs, model_version=model_version, outputs=outputs,
                                   request_id=request_id, sequence_id=sequence_id, sequence_start=sequence_start,
                                   sequence_end=sequence_end, priority=priority, timeout=timeout,
                                   client_timeout=client_timeout, headers=headers,
                                   compression_algorithm=compression_algorithm, parameters=parameters)


    def stream_infer(self, inputs_iterator: Any, stream_timeout: Any = None, headers: Any = None,
                     compression_algorithm: Any = None) -> Any:
        """tritonclient.grpc.aio's ``stream_infer``: an async iterator of ``(result, error)``, one
        per response, in the order the server sends them; each request's inputs copied into
        a slot (held until the server's last response to it), its outputs in the responses.

        *inputs_iterator* yields dicts of ``async_stream_infer``'s keyword arguments, as
        tritonclient's; a request the slots cannot carry goes on the same stream as
        tritonclient builds it.  The iterator's ``cancel()`` cancels the stream.
        """
        return _stream.AioFacadeStream(self, self._tritonshm_slots, inputs_iterator, stream_timeout, headers,
                                       compression_algorithm)


    async def unregister_system_shared_memory(self, name: str = "", headers: Any = None,
                                              client_timeout: Any = None) -> None:
        """tritonclient.grpc.aio's ``unregister_system_shared_memory``; with no *name*, a refusal for
        nothing but this client's slots a request runs on is no failure (see
        :meth:`~tritonshm.facade._route.SlotRoute.unregister`)."""
        await self._tritonshm_slots.unregister_aio(
            self, functools.partial(super().unregister_system_shared_memory, name, headers, client_timeout), name, headers)

_DEFAULTS = {name: parameter.default
             for name, parameter in inspect.signature(_tritonclient_grpc_aio.InferenceServerClient.infer).parameters.items()}
