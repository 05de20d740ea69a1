"""What :mod:`tritonshm.grpc` and :mod:`tritonshm.http` (and their ``.aio``) share: a tritonclient
``infer`` / ``async_infer`` call carried through a held :class:`tritonshm.Client`'s slot pools
(a :class:`tritonshm.aio.Client`'s for the aio facades), and its result answered as
tritonclient's.  One decision for all of them (:meth:`SlotRoute._plan`); only the last step --
run, submit, or await -- differs.

A call is taken by the slots only when they can carry it exactly as tritonclient would send it:
every input given data with ``set_data_from_numpy``, the model's inputs each once with its
datatype and a shape it takes, a batch within ``max_batch_size``, outputs asked for by name only
(not bound to shared memory by hand, no classification, binary over HTTP), options the client's
:class:`~tritonshm.RequestOptions` takes, no ``request_id`` or ``query_params``.  Any other call
goes to tritonclient's own ``infer`` untouched: the same request on the wire, so the same answer
-- and for a mistake, the server's own error with its ``status()``, not one of ours.  Nothing here
changes the caller's ``InferInput`` / ``InferRequestedOutput`` objects: their bytes are read and
copied into a slot once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import math
import threading
import weakref
from typing import Any, Awaitable, Callable, Collection, Generator, Mapping, NamedTuple, Sequence

import numpy as np

from .. import _tritonclient_compat as compat, triton
from ..client import RequestOptions
from ..errors import ClientClosed, InferenceServerException, ServerError, ServerTimeout

__all__ = ["AioHeldSlots", "HeldSlots", "SlotRoute", "SlotResult", "SlotCallContext", "SlotAsyncRequest",
           "SHM_URL_SCHEMES", "InTritonclientsWords", "in_tritonclients_words"]

#: The tritonshm URL scheme of each protocol, plain and over TLS.
SHM_URL_SCHEMES = {("grpc", False): "", ("grpc", True): "grpcs://",
                   ("http", False): "http://", ("http", True): "https://"}


def _parameters(tensor: Any, http: bool) -> Mapping[str, Any]:
    """The parameters of a request object's tensor (gRPC: a protobuf map; HTTP: a dict)."""
    return (tensor.get("parameters") or {}) if http else tensor.parameters


class SlotRoute:
    """The slot pools of one facade client: a :class:`tritonshm.Client` for the same server,
    made on the first call it can carry, and the conversion of tritonclient's request objects
    to its inputs and of its outputs to a tritonclient result.

    *protocol* is ``"grpc"`` or ``"http"``; *url* and *ssl* are what the facade's constructor
    took; *connect_options* its other arguments that differ from tritonclient's defaults, passed
    on to the tritonclient client the slots' client holds.  *kept_input* is the facade's
    ``InferInput`` (a :class:`KeptInput`; tritonclient's own are read too).  *result_type* is the facade's result
    class (see :func:`~tritonshm._tritonclient_compat.result_class`).  With *aio* the slots are
    a :class:`tritonshm.aio.Client` (for :meth:`infer_aio`; closed with :meth:`aclose`).  With
    *verbose* (the facade's), a call through the slots prints what tritonclient's prints.
    """

    def __init__(self, protocol: str, url: str, ssl: bool, connect_options: Mapping[str, Any],
                 module: Any, kept_input: type, result_type: type, aio: bool = False, verbose: bool = False,
                 facade: Any = None, concurrency: int | None = None):
        self.http = protocol == "http"
        # tritonclient.http's async_infer runs *concurrency* requests at a time, in the order
        # made (one, by default: a sequence's steps arrive in order); None: the held client's own.
        self._concurrency = concurrency
        # The facade (weakly: it holds this), whose plugin's headers go with the held client's own
        # calls too -- registrations, unregisters, model reads -- as tritonclient's calls carry them.
        self._facade = None if facade is None else weakref.ref(facade)
        self._aio = aio
        #: The facade's ``verbose``: its calls through the slots print what tritonclient's print
        #: (see :class:`Told`).
        self.verbose = bool(verbose)
        self.url = SHM_URL_SCHEMES[(protocol, bool(ssl))] + url
        self._connect_options = dict(connect_options)
        self._module = module
        self._kept_input: Any = kept_input  # Any: narrowing by it must not hide the input's methods
        self._result_type = result_type
        self._client: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, str], str] = {}

    @property
    def client(self) -> Any:
        """The :class:`tritonshm.Client` holding the slot pools, or None before the first call
        that used them (or after :meth:`close`)."""
        return self._client

    def _shm_client(self) -> Any:
        with self._lock:
            if self._client is None and not self._closed:
                client: Any
                if self._aio:
                    from ..client._aio import Client as AioClient

                    client = AioClient(self.url, connect_options=self._connect_options or None)
                else:
                    from ..client import Client

                    # The slots' own connection: tritonclient's HTTP client is the caller's thread's.
                    client = Client(self.url, connect_options=self._connect_options or None)
                if self.verbose:
                    _tell_sends(client, self._aio)
                if self._facade is not None:
                    client._engine.headers_from = functools.partial(_plugin_headers, self._facade)
                self._client = client
            return self._client

    def close(self) -> None:
        """Unregister and unlink the slots (the server's other regions are left be); idempotent.
        Later calls go to tritonclient's own ``infer``.  Requests still pending end as
        tritonclient's ``close()`` ends them: over gRPC cancelled (its channel closes under
        them), over HTTP waited for (it joins its pool)."""
        with self._lock:
            self._closed, client, self._client = True, self._client, None
        if client is not None:
            client.close(cancel_requests=not self.http)

    async def aclose(self) -> None:
        """:meth:`close` of a route whose slots are a :class:`tritonshm.aio.Client`: requests still
        pending are cut off over either protocol, as tritonclient's aio clients' ``close()`` ends
        them (gRPC: ``asyncio.CancelledError``; HTTP: aiohttp's ``ServerDisconnectedError``)."""
        with self._lock:
            self._closed, client, self._client = True, self._client, None
        if client is not None:
            await client.close(cancel_requests=True)

    # -- a call ---------------------------------------------------------------
    #
    # One plan for every entry point: :meth:`_plan` is a generator that yields each call it makes
    # (the held client's ``model_info``, the facade's ``get_model_metadata``) and is sent back its
    # answer -- the value itself from a blocking client, the awaited value from an aio one -- so
    # the blocking and the asyncio facades decide alike what the slots take, and only the last
    # step (``infer``, ``infer_async`` or awaiting ``infer``) differs.

    def infer(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
              outputs: Sequence[Any] | None, request_id: str, options: Mapping[str, Any]) -> Any:
        """The call carried through the slots, its result a tritonclient ``InferResult``; or None
        when they cannot carry it exactly (the caller then sends it with tritonclient's ``infer``).

        *options* are tritonclient's keyword arguments of the call other than those named here,
        only those not at their defaults.
        """
        planned = _drive(self._plan(facade, model_name, inputs, model_version, outputs, request_id, options))
        if planned is None:
            return None
        told = self._told("infer", facade, planned)
        try:
            made = _telling(told, planned.client.infer, model_name, planned.arrays, outputs=planned.wanted,
                            version=model_version, options=planned.options)
        except ServerError as error:
            reworded = in_tritonclients_words(error, self.http)
            if reworded is error:
                raise
            raise reworded from None  # (the held client's words: its debug_details())
        return planned.result(made, told)

    def infer_async(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
                    outputs: Sequence[Any] | None, request_id: str,
                    options: Mapping[str, Any]) -> concurrent.futures.Future | None:
        """:meth:`infer` without waiting: a ``concurrent.futures.Future`` of the result (or of the
        ``InferenceServerException`` that ended it), or None as for :meth:`infer`.

        What the slots take is decided, and the inputs copied from, on the calling thread, now
        (as tritonclient serialises them in ``async_infer``); the request runs on the held
        client's worker threads.  Cancelling the future before it ran cancels the request.
        """
        planned = _drive(self._plan(facade, model_name, inputs, model_version, outputs, request_id, options))
        if planned is None:
            return None
        # The request runs later, on a worker thread: an array the caller's InferInput keeps
        # (ours) is copied now, as tritonclient serialises it now -- the caller may change it
        # once this returns.  tritonclient's own bytes are immutable: read where they are.
        kept = {given.name() for given in inputs if type(given) is self._kept_input and given.kept_array() is not None}
        arrays = {name: array.copy() if name in kept else array for name, array in planned.arrays.items()}
        told = self._told("async_infer", facade, planned)
        if told is None and self._concurrency is None:
            pending = planned.client.infer_async(model_name, arrays, outputs=planned.wanted,
                                                 version=model_version, options=planned.options)
        else:  # the held client's infer_async on workers of tritonclient's concurrency, told what to print
            # (numpy only: nothing to capture)
            workers = planned.client._workers_for("async" if self._concurrency is None else "facade",
                                                  self._concurrency)
            pending = workers.submit(_telling, told, planned.client.infer, model_name, arrays,
                                     outputs=planned.wanted, version=model_version, options=planned.options)
        # The request keeps the facade alive until it ends, as tritonclient's callback (which
        # names its client) does: a facade dropped meanwhile is closed -- its slots with it --
        # only once its requests are answered, not under them.
        return _then(pending, functools.partial(planned.result, told=told), keep=facade,
                     failed=functools.partial(in_tritonclients_words, http=self.http))

    async def infer_aio(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
                        outputs: Sequence[Any] | None, request_id: str, options: Mapping[str, Any]) -> Any:
        """:meth:`infer` of an asyncio facade: its held client a :class:`tritonshm.aio.Client`
        (``aio=True``), *facade* tritonclient's aio client."""
        planned = await _drive_aio(self._plan(facade, model_name, inputs, model_version, outputs, request_id,
                                              options))
        if planned is None:
            return None
        # The aio client captures the inputs when infer() is called, before the first await.
        told = self._told("infer", facade, planned)
        token = _TOLD.set(told)  # (the held client's steps run in tasks that copy this context)
        try:
            made = await planned.client.infer(model_name, planned.arrays, outputs=planned.wanted,
                                              version=model_version, options=planned.options)
        except ClientClosed:
            if not self._closed:
                raise
            # close() cut it off: tritonclient's call raises what its connection's closing raises
            if self.http:  # (aiohttp: tritonclient.http.aio's own dependency)
                from aiohttp import ServerDisconnectedError

                raise ServerDisconnectedError() from None
            raise asyncio.CancelledError() from None  # grpc.aio's
        except ServerError as error:
            reworded = in_tritonclients_words(error, self.http, aio=True)
            if reworded is error:
                raise
            raise reworded from None  # (the held client's words: its debug_details())
        finally:
            _TOLD.reset(token)
        return planned.result(made, told)

    def stream_to(self, stream: Any, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
                  outputs: Sequence[Any] | None, request_id: str, options: Mapping[str, Any]) -> Any:
        """One request of a gRPC stream (``async_stream_infer``) sent on *stream* (a
        :class:`~tritonshm.facade._stream.FacadeStream`'s per-request sender) with its inputs
        in a slot, its outputs in the responses as tritonclient asks for them (*outputs* sent
        as they are); its :class:`~tritonshm.client._stream.Streamed` entry.  None where the
        slots cannot carry the inputs exactly as tritonclient sends them: the caller sends
        tritonclient's own request."""
        planned = _drive(self._plan(facade, model_name, inputs, model_version, outputs, request_id, options,
                                    streamed=True))
        if planned is None:
            return None
        return planned.client._stream_to(stream, model_name, planned.arrays, None if outputs is None else list(outputs),
                                         model_version, planned.options)

    async def stream_to_aio(self, stream: Any, facade: Any, model_name: str, inputs: Sequence[Any],
                            model_version: str, outputs: Sequence[Any] | None, request_id: str,
                            options: Mapping[str, Any]) -> Any:
        """:meth:`stream_to` of an aio facade (``stream_infer``), awaited."""
        planned = await _drive_aio(self._plan(facade, model_name, inputs, model_version, outputs, request_id,
                                              options, streamed=True))
        if planned is None:
            return None
        return await planned.client._stream_to(stream, model_name, planned.arrays,
                                               None if outputs is None else list(outputs), model_version,
                                               planned.options)

    def unregister(self, facade: Any, unregister: Callable[[], Any], name: str, headers: Any) -> None:
        """tritonclient's ``unregister_system_shared_memory`` of *facade* (*unregister*: the
        call, made): with no *name* (every region), a refusal for nothing but the held client's
        slots is no failure -- a request of ours runs on them, the server refuses to let go of
        a region in use and unregisters the rest, and tritonclient's client has no slots."""
        try:
            unregister()
        except InferenceServerException:
            if name or not self._only_slots_left(triton.status(facade, headers=headers)):
                raise

    async def unregister_aio(self, facade: Any, unregister: Callable[[], Awaitable[Any]], name: str,
                             headers: Any) -> None:
        """:meth:`unregister` of an asyncio facade."""
        try:
            await unregister()
        except InferenceServerException:
            if name or not self._only_slots_left(await triton.status(facade, headers=headers)):
                raise

    def _only_slots_left(self, registered: Collection[str]) -> bool:
        """Whether the server's system regions *registered* are all the held client's slots."""
        client = self._client
        ours = set() if client is None else {name for pool in client.pools() for name in pool.regions}
        return bool(registered) and set(registered) <= ours

    def heal(self, regions: Collection[str]) -> None:
        """Register again, under their names, the held client's slot pools that hold any of
        *regions*, which the server no longer knows (``unregister_system_shared_memory()`` of
        everything, a restart): before a streamed request it refused for that is sent again.
        The held client's own requests heal so themselves (its ``Runner``)."""
        client = self._client
        if client is not None:
            client._driver.drive(_heal_steps(client, regions))

    async def heal_aio(self, regions: Collection[str]) -> None:
        """:meth:`heal` of a route whose slots are a :class:`tritonshm.aio.Client`."""
        client = self._client
        if client is not None:
            await client._driver.drive(_heal_steps(client, regions))

    def _plan(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
              outputs: Sequence[Any] | None, request_id: str, options: Mapping[str, Any],
              streamed: bool = False) -> Generator[Any, Any, _Planned | None]:
        """Whether the slots take the call, and how: a :class:`_Planned`, or None.  Yields the
        calls it makes (see above) and is sent their answers.  A *streamed* request's outputs
        travel in its responses, as tritonclient asks for them: only its inputs are planned
        (its ``result`` and ``wanted`` are not used)."""
        if self._closed or (request_id and not streamed) or not isinstance(model_version, str):
            return None  # a version that is no string: tritonclient's own error
        if not compat.reads_request_objects(self.http):
            return None  # a tritonclient whose request objects we cannot read: its own call (warned once)
        arrays = self._arrays(inputs)
        names = _ALL if streamed else self._output_names(outputs)
        if arrays is None or names is None:
            return None
        if not streamed and sum(array.nbytes for array in arrays.values()) < facade.tritonshm_inline_bytes:
            return None  # small enough that the tensors in the message are faster (see _SlotsHeld)
        try:
            checked = RequestOptions.of(options)
            if streamed:
                checked.grpc_stream_infer_kwargs()
            else:
                checked.infer_kwargs(self.http)  # an option of the other protocol: refused here
        except InferenceServerException:
            return None  # tritonclient's call says what is wrong, its way
        if self.http and checked.client_timeout is not None:
            return None
        client = self._shm_client()
        if client is None:
            return None
        try:
            info = yield client.model_info(model_name, model_version)
        except InferenceServerException:
            return None  # the server says no: tritonclient's call says how, its way
        if not self._fits(info, inputs, arrays, names, streamed):
            return None
        if streamed:
            return _Planned(client, arrays, [], checked, _unused)
        headers = options.get("headers")
        plugin = facade.plugin()
        if plugin is not None:  # its headers, as tritonclient's call asks it for them: once a call
            asked = _PluginRequest(headers)
            plugin(asked)
            headers = asked.headers
            try:
                checked = checked.replace(headers=headers)
            except InferenceServerException:
                return None  # headers the held client refuses: tritonclient's call sends them its way
        # The version the server runs: known, else read (a verbose call takes it from the
        # response instead: the read would print what tritonclient's call does not).
        version = model_version or self._versions.get((model_name, "")) or (
            None if self.verbose else (yield from self._version_run(facade, model_name)))
        return _Planned(client, arrays, None if names is _ALL else names, checked,
                        functools.partial(self._made, model_name, version, info, client), headers)

    def _made(self, model_name: str, version: str | None, info: Any, client: Any,
              outputs_made: Mapping[str, np.ndarray], told: "Told | None" = None) -> Any:
        """The tritonclient result of the outputs the held client returned (a verbose call's
        version, where none was known, the one its response named).  A model that changed
        under the call (the held client read it again, and ran the call on it: ModelChanged)
        gives the result its outputs and the version that ran now."""
        now = client._engine.cached_model(model_name, info.version)
        if now is not None and now is not info:
            info = now
            if not info.version and info.versions:  # (the server's choice: the highest it serves)
                numeric = [v for v in info.versions if v.isdigit()]
                version = max(numeric, key=int) if numeric else info.versions[-1]
                self._versions[(model_name, "")] = version
        if version is None:
            version = told.version if told is not None and told.version else ""
            if version:
                self._versions[(model_name, "")] = version
        # In the response as the server orders them: the model's order, not the request's.
        specs = [spec for spec in info.outputs if spec.name in outputs_made]
        return self._result_type(model_name, version, specs, outputs_made)

    def _told(self, call: str, facade: Any, planned: "_Planned") -> "Told | None":
        """What a verbose facade's *call* prints (None: the facade is not verbose)."""
        if not self.verbose:
            return None
        return Told(call, self.http, self._aio, facade, planned.headers)

    def _arrays(self, inputs: Sequence[Any]) -> dict[str, np.ndarray] | None:
        """Each input's data as an array (views of the bytes tritonclient keeps, no copy), or
        None where an input is not tritonclient's of this protocol, has no data, was bound to
        shared memory by hand, or is named twice."""
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            return None
        kinds = (self._module.InferInput, self._kept_input)
        arrays: dict[str, np.ndarray] = {}
        for given in inputs:
            if type(given) not in kinds:  # a subclass may send what we do not read
                return None
            tensor = compat.tensor_of(given)
            if "shared_memory_region" in _parameters(tensor, self.http):
                return None  # bound by hand: sent as tritonclient sends it
            name, datatype, shape = given.name(), given.datatype(), [int(d) for d in given.shape()]
            if name in arrays:
                return None
            kept = given.kept_array() if type(given) is self._kept_input else None
            if kept is not None:
                array = kept.reshape(shape) if kept.size == math.prod(shape) and min(shape, default=0) >= 0 else None
            else:
                content = compat.input_content(given, self.http)
                array = self._array(datatype, shape, content, tensor.get("data") if self.http else None)
            if array is None:
                return None
            arrays[name] = array
        return arrays

    @staticmethod
    def _array(datatype: str, shape: list[int], content: bytes | None, data: Any) -> np.ndarray | None:
        from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

        if any(d < 0 for d in shape):
            return None
        if content is None:
            if data is None:
                return None  # no data: tritonclient sends it so, and the server says what is wrong
            if datatype in ("FP16", "BF16"):
                return None  # JSON data of these: the server refuses it, in its words
            array = np.array(data, dtype=np.object_ if datatype == "BYTES" else triton_to_np_dtype(datatype))
        elif datatype == "BYTES":
            array = deserialize_bytes_tensor(content) if content else np.empty(0, np.object_)
        else:
            dtype = triton_to_np_dtype(datatype)
            if dtype is None or len(content) != math.prod(shape) * np.dtype(dtype).itemsize:
                return None  # shape changed after the data was set: the server's error, not ours
            array = np.frombuffer(content, dtype=dtype)
        if array.size != math.prod(shape):
            return None
        return array.reshape(shape)

    def _output_names(self, outputs: Sequence[Any] | None) -> Any:
        """The outputs asked for by name (:data:`_ALL` for tritonclient's None), or None where
        one is not tritonclient's of this protocol, is bound to shared memory by hand, asks for
        classification, is JSON over HTTP, or is named twice."""
        if outputs is None:
            return _ALL
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            return None
        kind = self._module.InferRequestedOutput
        names: list[str] = []
        for given in outputs:
            if type(given) is not kind:
                return None
            parameters = _parameters(compat.tensor_of(given), self.http)
            if "shared_memory_region" in parameters or "classification" in parameters:
                return None
            if self.http and parameters.get("binary_data") is False:
                return None  # JSON data in the response: tritonclient's get_output shows it
            if given.name() in names:
                return None
            names.append(given.name())
        return names

    @staticmethod
    def _fits(info: Any, inputs: Sequence[Any], arrays: Mapping[str, np.ndarray], names: Any,
              streamed: bool = False) -> bool:
        """Whether the request is one the model takes as it is: every input once, of its datatype
        and a shape it takes, a batch within max_batch_size (never split here: tritonclient's
        semantics are the server's error), outputs the model has; decoupled only on a stream."""
        if (info.decoupled and not streamed) or set(arrays) != info.input_names:
            return False
        declared = {given.name(): given.datatype() for given in inputs}
        batch = None
        for spec in info.inputs:
            array = arrays[spec.name]
            if declared[spec.name] != spec.datatype:
                return False
            want = info.shape_of(spec, -1)
            if len(want) != array.ndim or any(w not in (-1, s) for w, s in zip(want, array.shape)):
                return False
            if info.batched:
                rows = array.shape[0]
                if batch not in (None, rows) or not 1 <= rows <= info.max_batch_size:
                    return False
                batch = rows
        return names is _ALL or all(name in info.output_names for name in names)

    def _version_run(self, facade: Any, model: str) -> Generator[Any, Any, str]:
        """The version the server runs when none is named: the highest it serves (Triton's
        choice), read once per model from its metadata (a :meth:`_plan` step)."""
        version = self._versions.get((model, ""))
        if version is None:
            metadata = yield facade.get_model_metadata(model)
            versions = list(metadata["versions"] if self.http else metadata.versions)
            numeric = [v for v in versions if str(v).isdigit()]
            version = max(numeric, key=int) if numeric else (versions[-1] if versions else "")
            self._versions[(model, "")] = version
        return str(version)


def _heal_steps(client: Any, regions: Collection[str]) -> Generator[Any, Any, None]:
    """The held *client*'s steps that register again every pool holding one of *regions* --
    those its own stream takes before it sends a refused request again (``Runner.stream_steps``)."""
    runner = client._runner
    for pool in client._engine.pool_table.in_service():
        if any(extent.name in regions for extent in pool.extents):
            yield from runner._register_again_steps(pool)


class _Planned(NamedTuple):
    """A call the slots take: the held client, what it is asked, and how its answer becomes
    tritonclient's result (``result(outputs, told)``)."""

    client: Any
    arrays: dict[str, np.ndarray]
    wanted: list[str] | None  # None or []: every output (the held client's outputs=)
    options: RequestOptions
    result: Callable[..., Any]
    headers: Any = None  # the call's headers as tritonclient's would send them (its plugin's too)


class _PluginRequest:
    """What a tritonclient plugin is handed (``plugin(request)``): the call's headers, to change."""

    def __init__(self, headers: dict[str, Any] | None):
        self.headers = headers if headers is not None else {}


def _plugin_headers(facade_ref: "weakref.ref[Any]") -> dict[str, Any] | None:
    """The headers the facade's plugin adds to a call made now (None: no facade or plugin)."""
    facade = facade_ref()
    plugin = None if facade is None else facade.plugin()
    if plugin is None:
        return None
    asked = _PluginRequest({})
    plugin(asked)
    return asked.headers or None


# -- verbose: what tritonclient prints for a call the slots carry ----------------------------

#: The verbose facade call the held client runs now, on this thread or task (its steps' tasks
#: copy it): the held client's sends print what tritonclient's call would have (:class:`Told`).
_TOLD: "contextvars.ContextVar[Told | None]" = contextvars.ContextVar("tritonshm_facade_told", default=None)


class Told:
    """One call of a verbose facade (``verbose=True``) carried through the slots: prints what
    tritonclient's own call prints -- the request that went to the server (the slot's
    shared-memory parameters where the tensors would be) and the server's response -- in
    tritonclient's words: gRPC ``"<call>, metadata ...\n<request>"`` then the response message;
    HTTP ``"POST <uri>, headers ...\n<body>"``, the response and its JSON.  Keeps the version
    the response names (:attr:`version`)."""

    def __init__(self, call: str, http: bool, aio: bool, facade: Any, headers: Mapping[str, Any] | None):
        self.call = call            # "infer" or "async_infer"
        self._http = http
        self._aio = aio
        self._headers = headers if headers is not None else {}  # the call's, the plugin's included
        # Where tritonclient's HTTP client posts: its URL's path (aio: the whole URL).
        self._base = getattr(facade, "_url" if aio else "_base_uri", "") if http else ""
        self._target = ""
        self.version: str | None = None

    def sending(self, step: Any) -> None:
        """Print the request of the held client's *step* (a ``Send``) as tritonclient does."""
        if self._http:
            from .. import _http1
            from ..client import _messages

            prepared = step.message if isinstance(step.message, _http1.Prepared) else _messages.http_request(step)
            self._target = prepared.target
            print("POST {}, headers {}\n{!r}".format(self._base + prepared.target, prepared.headers, prepared.body))
        else:
            message = step.message.request if step.message is not None else _grpc_message(step)
            print("{}, metadata {}\n{}".format(self.call, self._headers.items(), message))
        if self.call == "async_infer":
            print("Sent request")

    def answered(self, result: Any) -> None:
        """Print the server's response (*result*, what the held client's send returned)."""
        response = result.get_response()
        if not self._http:
            self.version = response.model_version
            print(response)
            return
        self.version = str(response.get("model_version", "")) or None
        # (the HTTP response's head is gone by now: shown as tritonclient's HTTP client shows
        # Triton's answer to a request with no tensor in it -- its JSON, nothing after it)
        content = json.dumps(response, separators=(",", ":")).encode()
        if self._aio:
            print(f"<ClientResponse({self._base}{self._target}) [200 OK]>\n"
                  f"<CIMultiDictProxy('Content-Type': 'application/json', 'Content-Length': '{len(content)}')>\n")
        else:
            print(f"<HTTPSocketPoolResponse status=200 headers={{'Content-Type': 'application/json', "
                  f"'Content-Length': '{len(content)}'}}>")
        print(content)


#: tritonclient.grpc's request builder's arguments at ``infer``'s defaults.
_GRPC_REQUEST_DEFAULTS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False, "priority": 0,
                          "timeout": None, "parameters": None}


def _grpc_message(step: Any) -> Any:
    """The ``ModelInferRequest`` tritonclient builds for a held client's ``Send`` that carries no
    message made ready (it has options): what goes to the server."""
    options = {} if step.options is None else step.options.grpc_stream_infer_kwargs()
    return compat.grpc_request(model_name=step.model, inputs=step.inputs, model_version=step.version, request_id="",
                               outputs=step.outputs, **{**_GRPC_REQUEST_DEFAULTS, **options})


def _tell_sends(client: Any, aio: bool) -> None:
    """Make the held *client* (a verbose facade's) print, around each request it sends for a
    verbose call (:data:`_TOLD`), what tritonclient's call prints; its other sends as they were."""
    from ..client._steps import Send

    handlers = client._driver.handlers
    send = handlers[Send]

    async def told_send_aio(step: Any) -> Any:
        told = _TOLD.get()
        if told is None:
            return await send(step)
        told.sending(step)
        result = await send(step)
        told.answered(result)
        return result

    def told_send(step: Any) -> Any:
        told = _TOLD.get()
        if told is None:
            return send(step)
        told.sending(step)
        result = send(step)
        told.answered(result)
        return result

    handlers[Send] = told_send_aio if aio else told_send


def _telling(told: "Told | None", call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` (a held client's blocking call) with *told* as this thread's
    :data:`_TOLD` meanwhile."""
    token = _TOLD.set(told)
    try:
        return call(*args, **kwargs)
    finally:
        _TOLD.reset(token)


def _drive(plan: Generator[Any, Any, _Planned | None]) -> _Planned | None:
    """Run a :meth:`SlotRoute._plan` of a blocking client: each yielded value is already the
    answer (the call ran, or raised inside the plan, where it was made)."""
    try:
        answer = next(plan)
        while True:
            answer = plan.send(answer)
    except StopIteration as done:
        return done.value


async def _drive_aio(plan: Generator[Any, Any, _Planned | None]) -> _Planned | None:
    """Run a :meth:`SlotRoute._plan` of an aio client: each yielded value is awaited, and its
    answer (or its failure) handed back to the plan."""
    try:
        pending = next(plan)
        while True:
            try:
                answer = await pending
            except Exception as failure:
                pending = plan.throw(failure)
            else:
                pending = plan.send(answer)
    except StopIteration as done:
        return done.value


def _then(pending: concurrent.futures.Future, make: Callable[[Any], Any], keep: Any = None,
          failed: Callable[[BaseException], BaseException] | None = None) -> concurrent.futures.Future:
    """A future of ``make(pending's value)``; *pending*'s failure (as ``failed(failure)`` says
    it, where given) or cancellation as its own.  Cancelling it cancels *pending* (a request not
    yet started is never sent).  *keep* is held until *pending* is settled and the future's
    callbacks have run, then let go of."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    kept = [keep]  # (a list: emptied once settled, so a finished request pins nothing)

    def settle(done: concurrent.futures.Future) -> None:
        try:
            _settle(done)
        finally:
            kept.clear()  # last: the callbacks have run; dropping it may close a dropped facade

    def _settle(done: concurrent.futures.Future) -> None:
        if future.cancelled():
            return  # cancelled while it ran: the caller was told so already
        if done.cancelled():
            future.cancel()
            future.set_running_or_notify_cancel()
            return
        try:
            value = make(done.result())
        except BaseException as failure:
            future.set_exception(failure if failed is None else failed(failure))
        else:
            future.set_result(value)

    pending.add_done_callback(settle)
    future.add_done_callback(lambda f: pending.cancel() if f.cancelled() else None)
    return future


class InTritonclientsWords:
    """The mixin of an error tritonshm.grpc / .http raise for a server's error the held client
    raised (see :func:`in_tritonclients_words`): ``message()`` is the server's message alone and
    ``str()`` tritonclient's ``"[status] message"``, as tritonclient's own call would have raised
    it.  The error is a :class:`~tritonshm.ServerError` (of the held client's class where that
    has no base of Python's own: ``ModelChanged``), with its ``status()``, ``outcome`` and the
    rest -- but never a ``TimeoutError``, ``ConnectionError`` or ``LookupError``, which
    tritonclient's never is: ``except TimeoutError`` takes the branch it takes with tritonclient.
    Its ``debug_details()`` is the server's where it sent one, else the held client's whole
    message (what it was doing)."""

    def __str__(self) -> str:
        return InferenceServerException.__str__(self)  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[Any, ...]:
        # (its class is made here, with no name pickle can import: made again from its base)
        base = type(self).__mro__[2]
        return _reworded, (base, getattr(self, "args", ()), dict(self.__dict__))


def _tritonclients_kind(cls: type) -> type:
    """The nearest of *cls*'s classes (itself first) that is a ServerError with no base of
    Python's own (``ServerTimeout`` is also a ``TimeoutError``: ``ServerError``)."""
    for klass in cls.__mro__:
        if issubclass(klass, ServerError) and not any(
                base.__module__ == "builtins" and base not in (Exception, BaseException, object)
                for base in klass.__mro__):
            return klass
    return ServerError


@functools.cache
def _worded_class(base: type) -> type:
    """The class of :class:`InTritonclientsWords` over *base* (a ServerError class), its name the base's."""
    return type(base.__name__, (InTritonclientsWords, base), {"__module__": base.__module__,
                                                              "__qualname__": base.__qualname__,
                                                              "__doc__": base.__doc__})


def _reworded(base: type, args: tuple, state: dict[str, Any]) -> Any:
    cls = _worded_class(base)
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


def in_tritonclients_words(error: BaseException, http: bool, aio: bool = False) -> BaseException:
    """*error*, a failure of the held client's call, as tritonclient's own call would have said
    it: a server's error (its ``said``) with tritonclient's ``str()`` and ``message()``
    (:class:`InTritonclientsWords`); over HTTP, the held client's network timeout as
    tritonclient.http's: gevent's socket timeout, a plain ``TimeoutError`` (``'timed out'``;
    *aio*: aiohttp's, without a message) -- not an ``InferenceServerException``, so that code
    catching that first takes the branch it takes with tritonclient.  Any other failure is
    tritonshm's own (no slot free, the client closed ...): as it is."""
    if not isinstance(error, ServerError):
        return error
    if error.said is not None:
        args: tuple = (error.said,)
    elif http and isinstance(error, ServerTimeout) and error.status() is None:
        return TimeoutError(*(() if aio else ("timed out",)))
    else:
        return error
    reworded = _reworded(_tritonclients_kind(type(error)), args, dict(error.__dict__))
    if reworded.debug_details() is None:  # (tritonclient's had none: what the held client was doing)
        reworded._debug_details = error.message()
    return reworded


def _unused(outputs: Mapping[str, np.ndarray]) -> Any:
    """A streamed request's :attr:`_Planned.result`: its results are the server's responses."""
    raise AssertionError("a streamed request has no slot result")


class _All:
    """Every output of the model (tritonclient's ``outputs=None``)."""

    def __repr__(self) -> str:
        return "<all outputs>"


_ALL: Any = _All()


class SlotResult:
    """The result of a call the slots carried: what tritonclient's ``InferResult`` answers.

    ``as_numpy(name)`` is the output's array (of tritonclient's dtype: BYTES an object array of
    bytes, BF16 ``ml_dtypes.bfloat16``; None for a name not in the result), copied out of the
    slot; ``get_output(name)`` and ``get_response()`` (tritonclient's own methods) answer from the
    response the server would have sent over the wire with the tensors in it: built on first
    use, so a caller who reads only ``as_numpy`` never pays for it.
    """

    def __init__(self, model_name: str, model_version: str, specs: Sequence[Any],
                 arrays: Mapping[str, np.ndarray]):
        self._model = model_name
        self._version = model_version
        self._specs = list(specs)
        self._arrays = dict(arrays)

    def as_numpy(self, name: str) -> np.ndarray | None:
        """The output *name* as a numpy array, as tritonclient's ``as_numpy``; None if absent."""
        return self._arrays.get(name)

    def _raw(self, spec: Any) -> bytes:
        """Output *spec*'s bytes as the server sends them (BYTES: length-prefixed)."""
        array = self._arrays[spec.name]
        if spec.is_bytes:
            from tritonclient.utils import serialize_byte_tensor

            serialized = serialize_byte_tensor(array)
            return serialized.item() if serialized.size > 0 else b""
        return np.ascontiguousarray(array).tobytes()


class GrpcSlotResult(SlotResult):
    """A :class:`SlotResult` of ``tritonclient.grpc``: its response a ``ModelInferResponse``."""

    def _make_response(self) -> Any:
        from tritonclient.grpc import service_pb2

        response = service_pb2.ModelInferResponse(model_name=self._model, model_version=self._version)
        for spec in self._specs:
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = spec.name, spec.datatype
            tensor.shape.extend(self._arrays[spec.name].shape)
            response.raw_output_contents.append(self._raw(spec))
        return response


class HttpSlotResult(SlotResult):
    """A :class:`SlotResult` of ``tritonclient.http``: its response the JSON header as a dict,
    each output's ``binary_data_size`` what its bytes would have taken after it."""

    def _make_response(self) -> Any:
        outputs = [{"name": spec.name, "datatype": spec.datatype, "shape": list(self._arrays[spec.name].shape),
                    "parameters": {"binary_data_size": len(self._raw(spec))}} for spec in self._specs]
        return {"model_name": self._model, "model_version": self._version, "outputs": outputs}


class SlotCallContext:
    """What gRPC's ``async_infer`` returns for a call the slots carry, as tritonclient's
    ``CallContext``: :meth:`cancel`."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def cancel(self) -> None:
        """Cancel the request: the callback is told so (``StatusCode.CANCELLED``), as tritonclient's
        is, unless it was answered already.  A request the server is running keeps its slot until
        the server is done with it."""
        self._future.cancel()


def answer_callback(callback: Callable[..., Any], done: concurrent.futures.Future) -> None:
    """Call gRPC's ``async_infer`` *callback* as tritonclient does, ``callback(result=, error=)``,
    for the finished future *done* of :meth:`SlotRoute.infer_async`."""
    result = error = None
    if done.cancelled():
        # tritonclient's get_cancelled_error(), made here: that one is private.
        error = InferenceServerException(msg="Locally cancelled by application!", status="StatusCode.CANCELLED")
    else:
        failure = done.exception()
        if failure is None:
            result = done.result()
        elif isinstance(failure, InferenceServerException):
            error = failure
        else:  # not an error tritonclient would name: still the callback's to hear, not a lost thread's
            error = InferenceServerException(msg=f"{type(failure).__name__}: {failure}")
    callback(result=result, error=error)


class SlotAsyncRequest:
    """The mixin of HTTP's ``async_infer`` answer for a call the slots carry (made a
    ``tritonclient.http.InferAsyncRequest`` by each facade): :meth:`get_result`."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def get_result(self, block: bool = True, timeout: float | None = None) -> Any:
        """The result, as tritonclient's ``InferAsyncRequest.get_result``: waits for it (at most
        *timeout* seconds; not at all unless *block*), else raises ``InferenceServerException``
        "failed to obtain inference response"; the request's own error if it failed."""
        try:
            return self._future.result(timeout=timeout if block else 0)
        except concurrent.futures.TimeoutError:  # (the builtin TimeoutError: a network timeout's too)
            if self._future.done():  # the request's own failure, or answered just now
                return self._future.result()
            raise InferenceServerException(msg="failed to obtain inference response") from None


class KeptInput:
    """The mixin of the facades' ``InferInput`` (before tritonclient's class in its bases):
    ``set_data_from_numpy`` keeps the caller's array where tritonclient would serialise it
    (``tobytes()``: a copy of the whole tensor), so a call the slots carry copies it once,
    into the slot.  Where tritonclient's own request builder asks for the bytes (a call that
    goes on the wire) they are made then, once, as tritonclient would have made them.

    Only what tritonclient keeps as raw bytes is kept as an array: a numpy array whose dtype
    and shape are the input's, not BYTES, binary over HTTP.  Anything else -- and every
    mistake -- is tritonclient's own ``set_data_from_numpy``, its errors its own.

    The array is read at the call that sends it, not when it is set (``async_infer`` copies it
    at the call): change it in place in between and the new values are sent.
    """

    _tritonshm_kept: np.ndarray | None = None
    _tritonshm_bytes: bytes | None = None
    _tritonshm_http: bool  # each facade's class says which protocol's InferInput it extends

    def _set_data(self, input_tensor: Any, binary_data: bool, *args: Any) -> Any:
        """tritonclient's ``set_data_from_numpy(input_tensor, *args)``, keeping *input_tensor*
        rather than a copy of its bytes where it can (see the class); the input, as
        tritonclient's returns.  Each facade's ``InferInput`` calls it with its own signature."""
        self._tritonshm_kept = self._tritonshm_bytes = None
        shape = [int(d) for d in self.shape()]  # type: ignore[attr-defined]
        if not (self._keepable(input_tensor, shape, binary_data) and compat.reads_request_objects(self._tritonshm_http)):
            return super().set_data_from_numpy(input_tensor, *args)  # type: ignore[misc]
        # tritonclient's own state change (shared-memory parameters dropped, the data's size
        # noted), on an empty array of the same dtype; then the shape as it was.
        self.set_shape([0] * len(shape))  # type: ignore[attr-defined]
        try:
            super().set_data_from_numpy(np.empty([0] * len(shape), input_tensor.dtype), *args)  # type: ignore[misc]
        finally:
            self.set_shape(shape)  # type: ignore[attr-defined]
        self._tritonshm_kept = input_tensor
        compat.note_binary_size(self, input_tensor.nbytes)
        return self

    def _keepable(self, array: Any, shape: list[int], binary_data: bool) -> bool:
        from tritonclient.utils import np_to_triton_dtype

        datatype = self.datatype()  # type: ignore[attr-defined]
        return (type(array) is np.ndarray and binary_data is True and datatype != "BYTES"
                and array.dtype != np.object_ and np_to_triton_dtype(array.dtype) == datatype
                and list(array.shape) == shape)

    def set_shared_memory(self, region_name: str, byte_size: int, offset: int = 0) -> Any:
        """tritonclient's ``set_shared_memory`` (the array kept is let go of)."""
        self._tritonshm_kept = self._tritonshm_bytes = None
        return super().set_shared_memory(region_name, byte_size, offset)  # type: ignore[misc]

    def kept_array(self) -> np.ndarray | None:
        """The array ``set_data_from_numpy`` kept (None: tritonclient's own bytes, or no data)."""
        return self._tritonshm_kept

    def kept_bytes(self) -> bytes | None:
        """The kept array's bytes as tritonclient would have made them (made once, on first
        use), or None where nothing is kept."""
        if self._tritonshm_kept is None:
            return None
        if self._tritonshm_bytes is None:
            self._tritonshm_bytes = self._tritonshm_kept.tobytes()
        return self._tritonshm_bytes


class GrpcKeptInput(KeptInput):
    """tritonshm.grpc's ``InferInput`` (made a ``tritonclient.grpc.InferInput`` by
    :func:`~tritonshm._tritonclient_compat.input_class`): tritonclient.grpc's, whose
    ``set_data_from_numpy`` keeps the array rather than a copy of its bytes (see
    :class:`KeptInput`), so a call through the slots copies it once."""

    _tritonshm_http = False

    def set_data_from_numpy(self, input_tensor: Any) -> Any:
        """tritonclient.grpc's ``set_data_from_numpy``: the array is kept, read at the call that
        sends it (see :class:`KeptInput`); its errors tritonclient's."""
        return self._set_data(input_tensor, True)


class HttpKeptInput(KeptInput):
    """tritonshm.http's ``InferInput`` (made a ``tritonclient.http.InferInput`` by
    :func:`~tritonshm._tritonclient_compat.input_class`): as :class:`GrpcKeptInput`, binary
    data only."""

    _tritonshm_http = True

    def set_data_from_numpy(self, input_tensor: Any, binary_data: bool = True) -> Any:
        """tritonclient.http's ``set_data_from_numpy``: binary data is kept as the array, read at
        the call that sends it (see :class:`KeptInput`); JSON data (``binary_data=False``) and
        errors are tritonclient's."""
        return self._set_data(input_tensor, binary_data, binary_data)


class _SlotsHeld:
    """What the four facade clients (``tritonshm.grpc`` / ``.http`` and their ``.aio``) share,
    before tritonclient's class in their bases: tritonclient's constructor (its signature too)
    and a :class:`SlotRoute` held for the same server.  Each client names its protocol,
    tritonclient's module and its result class in the class attributes below; its ``close()``
    comes from :class:`HeldSlots` or :class:`AioHeldSlots`."""

    _tritonshm_protocol: str          # "grpc" or "http"
    _tritonshm_module: Any            # tritonclient's module the client extends
    _tritonshm_input: type            # the facade's InferInput (a KeptInput)
    _tritonshm_result: type           # the client's SlotResult class
    _tritonshm_aio = False

    #: Calls whose inputs take fewer bytes than this go as tritonclient sends them, the tensors
    #: in the message: below it that is faster.  Measured with ``tritonshm bench`` (rows
    #: ``grpc`` / ``tritonshm.grpc``, one run, interleaved, 2-core machine): over gRPC the slots
    #: were slower at 4 KiB (0.85 against 0.71 ms) and 64 KiB (0.97 against 0.92) and faster
    #: from 256 KiB (1.00 against 1.77); over HTTP faster at every size (4 KiB: 0.57 against
    #: 0.61), so 0 there.  Set it on a client (0: every call through the slots).  Streams
    #: always use the slots.
    tritonshm_inline_bytes = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        module = cls.__dict__.get("_tritonshm_module")
        if module is not None:  # a facade client: inspect.signature(cls) is tritonclient's constructor's
            cls.__signature__ = inspect.signature(module.InferenceServerClient)  # type: ignore[attr-defined]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        constructor = inspect.signature(self._tritonshm_module.InferenceServerClient.__init__)
        given = constructor_arguments(constructor, args, kwargs)
        self._tritonshm_slots = SlotRoute(self._tritonshm_protocol, given.url, given.ssl, given.options,
                                          self._tritonshm_module, self._tritonshm_input, self._tritonshm_result,
                                          aio=self._tritonshm_aio, verbose=given.verbose, facade=self,
                                          concurrency=None if self._tritonshm_aio else given.concurrency)

    @property
    def tritonshm(self) -> Any:
        """The tritonshm client holding this client's slot pools (``pools()``, ``stats()``): a
        :class:`tritonshm.Client` (a :class:`tritonshm.aio.Client` for the aio modules), or None
        before the first :meth:`infer` that used them and after :meth:`close`."""
        return self._tritonshm_slots.client


class HeldSlots(_SlotsHeld):
    """:class:`_SlotsHeld` for the blocking clients of ``tritonshm.grpc`` / ``.http``."""

    def close(self) -> None:
        """Unregister and unlink this client's slots, then close it as tritonclient does."""
        slots = getattr(self, "_tritonshm_slots", None)  # None: the constructor failed
        if slots is not None:
            slots.close()
        super().close()  # type: ignore[misc]


class AioHeldSlots(_SlotsHeld):
    """:class:`_SlotsHeld` for the aio clients: their slots are a :class:`tritonshm.aio.Client`,
    and ``close()`` is awaited."""

    _tritonshm_aio = True

    async def close(self) -> None:
        """Unregister and unlink this client's slots, then close it as tritonclient does."""
        slots = getattr(self, "_tritonshm_slots", None)  # None: the constructor failed
        if slots is not None:
            await slots.aclose()
        await super().close()  # type: ignore[misc]


def changed(defaults: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The keyword arguments of a tritonclient call in *given* that are not at their *defaults*
    (what :meth:`SlotRoute.infer` takes as *options*)."""
    return {name: value for name, value in given.items() if value is not defaults[name]}


class ConstructorArguments(NamedTuple):
    """What a facade takes from a call of tritonclient's constructor (:func:`constructor_arguments`)."""

    url: str
    ssl: bool
    verbose: bool
    options: dict  # the others given at a value other than their default, for the slots' own client
    concurrency: int | None  # tritonclient.http's: how many async_infer requests run at once (None: gRPC)


def constructor_arguments(signature: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> ConstructorArguments:
    """What a call of tritonclient's constructor with *signature* (``self`` first) gave: the
    options are the arguments other than ``url``, ``verbose`` and ``ssl`` given at a value
    other than their default, for the slots' own tritonclient client (never verbose: the
    facade prints what tritonclient's call would, see :class:`Told`)."""
    bound = signature.bind(None, *args, **kwargs)
    given = dict(bound.arguments)
    given.pop("self", None)
    options = {name: value for name, value in given.items() if name not in ("url", "verbose", "ssl")
               and value is not signature.parameters[name].default}
    concurrency = given.get("concurrency", signature.parameters["concurrency"].default) \
        if "concurrency" in signature.parameters else None
    return ConstructorArguments(str(given["url"]), bool(given.get("ssl", False)), bool(given.get("verbose", False)),
                                options, None if concurrency is None else max(1, int(concurrency)))


def reexport(module: Any, namespace: dict[str, Any], own: Sequence[str] = ()) -> list[str]:
    """Put every public name of tritonclient's *module* into *namespace* (a facade module's
    globals), unchanged, but those in *own* (the facade's submodules, e.g. ``aio``: tritonclient's
    is in ``dir()`` once imported, and ``from tritonshm.grpc import aio`` must find ours); its
    ``__all__``."""
    for name in dir(module):
        if not name.startswith("_") and name not in own:
            namespace[name] = getattr(module, name)
    return list(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))
