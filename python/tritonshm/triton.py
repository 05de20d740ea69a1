"""Registering regions with Triton and binding them to requests (layer 4).

Works with tritonclient's gRPC and HTTP clients, and with their asyncio
variants: for an ``aio`` client, :func:`register`, :func:`unregister` and
:func:`status` return awaitables instead of results.

Rules this layer keeps, whatever the caller does:

* it registers whole regions, so the registration offset is always 0
  (page-aligned, as Triton's ``mmap`` of the key requires); a region's
  ``kind`` ("system", or "cuda" for :class:`~tritonshm.CudaRegion`) picks
  the extension, and CUDA handles travel base64-encoded for both protocols
  (tritonclient's gRPC client decodes them; HTTP sends them as they are);
* it only ever unregisters names it registered itself -- never "all";
* every offset and size is checked against the region, with the overflow
  guards of :meth:`SystemRegion.span`, before anything is sent;
* server failures become :class:`tritonshm.ServerError` subclasses whose
  message says what to do.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import math
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from . import _dtypes, _transport
from .errors import (OutOfBounds, RegionNotRegistered, RegistrationError, ServerError, ServerTimeout, ShapeMismatch,
                     translate_error)

__all__ = ["register", "unregister", "status", "bind_input", "bind_output", "registered_name"]

# Region -> the name it was registered under.  Weak, so registering does
# not keep a region alive.
_region_names: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()

# Every name this process registered -> its kind ("system" or "cuda");
# unregister() refuses any other name, and calls the extension of the kind.
_own_names: dict[str, str] = {}
_lock = threading.Lock()

# Triton answers a request before it lets go of the request's regions, and
# refuses to unregister one meanwhile ("... it is currently in use."): for a
# moment after every response, or for as long as a request runs -- releases
# 2.50-2.52.  From 2.53 the unregister succeeds at once and the server keeps the
# region (and its mapping of our memory) until those requests end (server PR
# #7743): unregister() then asks whether it still has the region, and says "in
# use" while it does, so that an unregister that succeeds means the server let
# go on every release.  It asks again for up to this long; callers that must
# never free memory under the server (the client's device pools) keep refused
# memory and retry later.
_IN_USE = "currently in use"
_IN_USE_PATIENCE = 1.0
_IN_USE_INTERVAL = 0.01


def default_name(region: Any) -> str:
    """The name a region is registered under unless told otherwise: its key
    without the slash, unique and unguessable like the key itself."""
    return region.key.lstrip("/")


def registered_name(region: Any) -> str | None:
    """The name *region* was registered under by :func:`register`, or None."""
    return _region_names.get(region)


def call_translated(client: Any, doing: str, method: str, *args: Any, on_success: Callable[[Any], Any] | None = None,
                    cuda: bool = False, address: str | None = None, answer_within: float | None = None,
                    **kwargs: Any) -> Any:
    """Call ``client.<method>(*args, **kwargs)``, turning tritonclient's
    failures into :class:`ServerError` subclasses that say what to do
    (*doing* opens the message; *address*, where known, is named when the
    server cannot be reached); for aio clients return an awaitable that
    does the same.  Used by this module and by the clients.

    *answer_within* (seconds) bounds the wait for the answer -- gRPC's
    ``client_timeout``, an aio client's await -- after which it is
    :class:`~tritonshm.ServerTimeout` (whether the server acted is unknown);
    0 or less: not asked at all, the same error.  A blocking HTTP client has no
    such bound per call: its ``network_timeout`` is the bound there.  (Not
    ``timeout``: that is a keyword of tritonclient's ``infer``, passed on.)"""

    def finish(result: Any) -> Any:
        return on_success(result) if on_success is not None else result

    timeout = answer_within
    if timeout is not None:
        if timeout <= 0:
            raise ServerTimeout(f"{doing}: no time was left to wait for the server's answer")
        wire = _transport.of_client(client)
        if not wire.aio and not wire.http:
            kwargs["client_timeout"] = timeout
    try:
        outcome = getattr(client, method)(*args, **kwargs)
    except ServerError:
        raise
    except Exception as exc:  # tritonclient raises its own type, or socket errors for HTTP
        raise translate_error(exc, doing, cuda=cuda, address=address) from exc
    if not inspect.isawaitable(outcome):
        return finish(outcome)

    async def awaited() -> Any:
        try:
            result = await (outcome if timeout is None else asyncio.wait_for(outcome, timeout))
        except asyncio.TimeoutError:
            raise ServerTimeout(f"{doing}: the server did not answer within {timeout:g} s") from None
        except Exception as exc:
            raise translate_error(exc, doing, cuda=cuda, address=address) from exc
        return finish(result)

    return awaited()


def register(client: Any, region: Any, name: str | None = None, *, device_id: int | None = None,
             headers: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
    """Register the whole of *region* with the server behind *client*.

    Returns the name (for an aio client, an awaitable of it).  *name*
    defaults to the region's key without its slash.  System (and pinned)
    regions use the system shared-memory extension; CUDA regions the CUDA
    one, on *device_id* -- the server's number for the region's GPU, which
    defaults to ``region.device`` and differs only when the server sees
    the GPUs through another ``CUDA_VISIBLE_DEVICES``.  *headers* go with the call (a server
    whose shared-memory API is restricted wants its header); *timeout* bounds it as in
    :func:`call_translated`.  The default name is this process's from the moment it is asked
    for, so that :func:`unregister` takes it also when whether the server registered it is
    unknown (a call cut off).
    """
    if region.closed:
        region.span()  # raises RegionClosed with the region's description
    name = default_name(region) if name is None else name
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"a registration name must be a non-empty str, not {name!r}")
    kind = region.kind
    doing = f"registering {region!r} as {name!r}"

    def remember(_: Any) -> str:
        with _lock:
            _region_names[region] = name
            _own_names[name] = kind
        return name

    if name == default_name(region):
        # Ours by construction (the region's unguessable key), so ours before the call: a call
        # cut off may have registered it all the same.  A name the caller chose is ours only
        # once the server took it (it may be another client's).
        with _lock:
            _own_names[name] = kind

    if kind == "cuda":
        device = region.device if device_id is None else device_id
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise RegistrationError(f"device_id must be a non-negative int, not {device!r}")
        handle = base64.b64encode(region.ipc_handle).decode("ascii")
        return call_translated(
            client, doing, "register_cuda_shared_memory",
            name, handle, device, region.nbytes, on_success=remember, cuda=True, answer_within=timeout, **_with(headers),
        )
    if device_id is not None:
        raise RegistrationError(f"device_id applies to CUDA regions only, not to {region!r}")
    return call_translated(
        client, doing, "register_system_shared_memory",
        name, region.key, region.nbytes, 0, on_success=remember, answer_within=timeout, **_with(headers),
    )


def _with(headers: Mapping[str, str] | None) -> dict[str, Any]:
    """tritonclient's ``headers=`` where there are any (test doubles of it may take none)."""
    return {"headers": dict(headers)} if headers else {}


def unregister(client: Any, name_or_region: Any, *, patience: float = _IN_USE_PATIENCE,
               headers: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
    """Unregister one of our regions, by name or by region; idempotent.

    Returns once the server let go of the region: a server that refuses
    because the region is in use (Triton does, for a moment after each
    response that used it, and while a request runs) is asked again for up
    to *patience* seconds before its error is raised.  One that defers the
    unregister instead (Triton 2.53 and later: it says yes, and keeps the
    region until the requests using it end) still lists the region: that
    too is "currently in use" (a :class:`ServerError`) until it is gone, so
    the region's memory is never closed while the server may still use it.

    Refuses names this process did not register: tritonshm never removes
    other clients' regions, and never unregisters "all".  The extension
    (system or CUDA) is the one the name was registered with.  *headers* go
    with the call.  *timeout* (seconds) bounds the whole of it, answers and
    patience together, as :func:`call_translated` bounds one call: past it,
    :class:`~tritonshm.ServerTimeout`, and whether the server let go is
    unknown (a server that hangs never holds the caller for ever).
    """
    if isinstance(name_or_region, str):
        name = name_or_region
    elif not hasattr(name_or_region, "kind"):
        raise RegistrationError(f"unregister() takes a registered name or region, not {name_or_region!r}")
    else:
        registered = registered_name(name_or_region)
        if registered is None:
            return _done(client, None)  # never registered: nothing to do
        name = registered
    if not name:
        raise RegistrationError("refusing to unregister without a name: that would remove every client's regions")
    with _lock:
        kind = _own_names.get(name)
    if kind is None:
        raise RegistrationError(
            f"{name!r} was not registered by this process; tritonshm only unregisters its own regions"
        )
    method = "unregister_cuda_shared_memory" if kind == "cuda" else "unregister_system_shared_memory"

    # The region keeps its name: it may still be registered with another
    # server, and a request naming it here gets the server's clear error.
    doing = f"unregistering {name!r}"
    ends = None if timeout is None else time.monotonic() + timeout
    if _transport.of_client(client).aio:
        return _unregister_patiently_aio(client, doing, method, name, kind, patience, headers, ends)
    deadline = time.monotonic() + patience
    while True:
        try:
            call_translated(client, doing, method, name, answer_within=_left(ends), **_with(headers))
            try:
                still = name in status(client, name, kind, headers=headers, timeout=_left(ends))
            except RegionNotRegistered:
                still = False
            if not still:
                return None  # gone: the server let go
            raise _deferred(doing, name)
        except ServerError as exc:
            if _IN_USE not in str(exc) or time.monotonic() >= min(deadline, ends or deadline):
                raise
        time.sleep(_IN_USE_INTERVAL)


async def _unregister_patiently_aio(client: Any, doing: str, method: str, name: str, kind: str, patience: float,
                                    headers: Mapping[str, str] | None = None, ends: float | None = None) -> Any:
    """:func:`unregister` for an aio client, asking again while the region is "in use" (*ends*:
    its timeout's end, on ``time.monotonic()``)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            await call_translated(client, doing, method, name, answer_within=_left(ends), **_with(headers))
            try:
                still = name in await status(client, name, kind, headers=headers, timeout=_left(ends))
            except RegionNotRegistered:
                still = False
            if not still:
                return None
            raise _deferred(doing, name)
        except ServerError as exc:
            if _IN_USE not in str(exc) or time.monotonic() >= min(deadline, ends or deadline):
                raise
        await asyncio.sleep(_IN_USE_INTERVAL)


def _left(ends: float | None) -> float | None:
    """Seconds until *ends* (a ``time.monotonic()`` instant; None: no bound)."""
    return None if ends is None else ends - time.monotonic()


def _deferred(doing: str, name: str) -> ServerError:
    """The server said yes to unregistering *name* and still has it: it deferred the unregister
    until the requests that use the region end (Triton 2.53 and later), and may still read or
    write the memory -- "in use", as the releases that refuse say."""
    return ServerError(f"{doing}: the server keeps {name!r} until the requests that use it end (it deferred "
                       f"the unregister): the region is currently in use")


def _done(client: Any, value: Any) -> Any:
    """*value*, or an awaitable of it for an aio client."""
    if not _transport.of_client(client).aio:
        return value

    async def ready() -> Any:
        return value

    return ready()


def status(client: Any, name: str | None = None, kind: str = "system", *,
           headers: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
    """The server's shared-memory regions of *kind* ("system" or "cuda") as a dict by name.

    System regions map to ``{key, offset, byte_size}``, CUDA regions to
    ``{device_id, byte_size}``.  With *name*, only that region (a missing
    one raises :class:`RegionNotRegistered`).  *headers* go with the call;
    *timeout* bounds it as in :func:`call_translated`.  For an aio client, an awaitable.
    """
    if kind not in ("system", "cuda"):
        raise RegistrationError(f"kind must be 'system' or 'cuda', not {kind!r}")
    what = "CUDA shared-memory" if kind == "cuda" else "shared-memory"
    doing = f"reading {what} status" if name is None else f"reading the status of {name!r}"
    kwargs = _transport.of_client(client).json  # gRPC answers protobufs unless asked for JSON
    method = "get_cuda_shared_memory_status" if kind == "cuda" else "get_system_shared_memory_status"
    return call_translated(client, doing, method, name or "", on_success=_cuda_regions_of if kind == "cuda"
                           else _regions_of, answer_within=timeout, **kwargs, **_with(headers))


def _entries(reply: Any) -> Any:
    """The region entries of gRPC (``{"regions": {name: {...}}}``) and HTTP (``[{...}]``) replies."""
    if isinstance(reply, dict):
        entries = reply.get("regions", {})
        return entries.values() if isinstance(entries, dict) else entries
    return reply or []


def _byte_size(entry: dict[str, Any]) -> int:
    return int(entry.get("byte_size", entry.get("byteSize", 0)))


def _regions_of(reply: Any) -> dict[str, dict[str, Any]]:
    return {
        entry["name"]: {"key": entry.get("key", ""), "offset": int(entry.get("offset", 0)),
                        "byte_size": _byte_size(entry)}
        for entry in _entries(reply)
    }


def _cuda_regions_of(reply: Any) -> dict[str, dict[str, Any]]:
    return {
        entry["name"]: {"device_id": int(entry.get("device_id", entry.get("deviceId", 0))),
                        "byte_size": _byte_size(entry)}
        for entry in _entries(reply)
    }


def _binding_name(region: Any, name: str | None) -> str:
    if region.closed:
        region.span()  # raises RegionClosed
    bound = name if name is not None else registered_name(region)
    if bound is None:
        raise RegistrationError(
            f"{region!r} is not registered: call tritonshm.register(client, region) first"
        )
    return bound


def _request_range(region: Any, offset: Any, nbytes: Any) -> tuple[int, int]:
    """``region.span(offset, nbytes)``, refusing what Triton refuses too: an offset at the end."""
    off, length = region.span(offset, nbytes)
    if off >= region.nbytes:
        raise OutOfBounds(f"{region!r}: offset={off} leaves no room (Triton needs offset < {region.nbytes})")
    return off, length


def bind_input(infer_input: Any, region: Any, offset: int = 0, nbytes: int | None = None,
               *, name: str | None = None) -> None:
    """Make *infer_input* read its tensor from *region* at *offset*.

    *nbytes* defaults to the tensor's size from the input's shape and
    datatype (BYTES inputs must give it).  The range is checked against the
    region before anything is sent.
    """
    bound = _binding_name(region, name)
    datatype = infer_input.datatype()
    shape = infer_input.shape()
    size = _dtypes.itemsize(datatype)
    expected = None if size is None else size * math.prod(shape)
    if nbytes is None:
        if expected is None:
            raise ShapeMismatch(
                f"input {infer_input.name()!r} is BYTES: give nbytes (the serialized size)"
            )
        nbytes = expected
    elif expected is not None and nbytes != expected:
        raise ShapeMismatch(
            f"input {infer_input.name()!r} is {datatype} {list(shape)}, i.e. {expected} bytes, "
            f"not nbytes={nbytes}"
        )
    off, length = _request_range(region, offset, nbytes)
    infer_input.set_shared_memory(bound, length, off)


def bind_output(requested_output: Any, region: Any, offset: int = 0, nbytes: int | None = None,
                *, name: str | None = None) -> None:
    """Make the server write *requested_output* into *region* at *offset*.

    *nbytes* (the room given to the output) defaults to the rest of the
    region.  The range is checked against the region before anything is sent.
    """
    bound = _binding_name(region, name)
    off, length = _request_range(region, offset, nbytes)
    requested_output.set_shared_memory(bound, length, off)
