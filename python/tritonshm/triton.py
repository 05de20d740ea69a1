"""Registering regions with Triton and binding them to requests (layer 4).

Works with tritonclient's gRPC and HTTP clients, and with their asyncio
variants: for an ``aio`` client, :func:`register`, :func:`unregister` and
:func:`status` return awaitables instead of results.

Rules this layer keeps, whatever the caller does:

* it registers whole regions, so the registration offset is always 0
  (page-aligned, as Triton's ``mmap`` of the key requires);
* it only ever unregisters names it registered itself -- never "all";
* every offset and size is checked against the region, with the overflow
  guards of :meth:`SystemRegion.span`, before anything is sent;
* server failures become :class:`tritonshm.ServerError` subclasses whose
  message says what to do.
"""

from __future__ import annotations

import inspect
import math
import re
import threading
import weakref
from typing import Any

from . import _dtypes
from .errors import (
    OutputTooSmall,
    RegionNotRegistered,
    RegistrationError,
    ServerError,
    ServerUnavailable,
    ShapeMismatch,
    SharedMemoryRefused,
)

__all__ = ["register", "unregister", "status", "bind_input", "bind_output", "registered_name"]

# Region -> the name it was registered under.  Weak, so registering does
# not keep a region alive.
_region_names: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
# Triton's words for an undersized output region.
_TOO_SMALL = re.compile(r"for output '(?P<output>[^']*)' \((?P<given>\d+) bytes\) should be at least (?P<needed>\d+) bytes")

# Every name this process registered; unregister() refuses any other.
_own_names: set[str] = set()
_lock = threading.Lock()


def _is_aio(client: Any) -> bool:
    return ".aio" in type(client).__module__


def _is_cuda(region: Any) -> bool:
    return hasattr(region, "ipc_handle")


def default_name(region: Any) -> str:
    """The name a region is registered under unless told otherwise: its key
    without the slash, unique and unguessable like the key itself."""
    return region.key.lstrip("/")


def registered_name(region: Any) -> str | None:
    """The name *region* was registered under by :func:`register`, or None."""
    return _region_names.get(region)


def translate_error(exc: BaseException, doing: str) -> ServerError:
    """Turn a tritonclient failure into a :class:`ServerError` that says what to do."""
    # tritonclient's InferenceServerException has message() and status() methods.
    message_of = getattr(exc, "message", None)
    status_of = getattr(exc, "status", None)
    message = (message_of() if callable(message_of) else "") or str(exc)
    lowered = message.lower()
    status = str(status_of()) if callable(status_of) else ""
    if "client shared memory is disabled" in lowered:
        return SharedMemoryRefused(
            f"{doing}: the server has client shared memory disabled; "
            f"start it with --allow-client-shm=true (Triton >= 2.69). Server said: {message}"
        )
    if "unable to open shared memory region" in lowered or "unable to open cuda" in lowered:
        return SharedMemoryRefused(
            f"{doing}: the server cannot open our shared memory. It must run on this machine, "
            f"in the same IPC namespace (--ipc=host for containers), as a user allowed to open "
            f"mode-0600 segments of ours. Server said: {message}"
        )
    if "already in manager" in lowered:
        return RegistrationError(
            f"{doing}: the server already has a region of that name; "
            f"unregister it first or pick another name. Server said: {message}"
        )
    if "unable to find" in lowered and "shared memory" in lowered:
        return RegionNotRegistered(
            f"{doing}: the server does not know this region: it was unregistered, or the "
            f"server restarted since it was registered; register it again. Server said: {message}"
        )
    too_small = _TOO_SMALL.search(message)
    if too_small is not None:
        return OutputTooSmall(
            f"{doing}: output {too_small['output']!r} needs {too_small['needed']} bytes but only "
            f"{too_small['given']} were bound; bind a larger nbytes. Server said: {message}",
            too_small["output"],
            int(too_small["needed"]),
        )
    if (
        isinstance(exc, ConnectionError)
        or "unavailable" in status.lower()
        or "failed to connect" in lowered
        or "connection refused" in lowered
        or "socket closed" in lowered
    ):
        return ServerUnavailable(f"{doing}: cannot reach the Triton server ({message})")
    return ServerError(f"{doing}: {message}")


def _call(client: Any, doing: str, method: str, *args: Any, on_success=None, **kwargs: Any) -> Any:
    """Call ``client.<method>(*args, **kwargs)``, translating errors; for aio
    clients return an awaitable that does the same."""

    def finish(result: Any) -> Any:
        return on_success(result) if on_success is not None else result

    try:
        outcome = getattr(client, method)(*args, **kwargs)
    except ServerError:
        raise
    except Exception as exc:  # tritonclient raises its own type, or socket errors for HTTP
        raise translate_error(exc, doing) from exc
    if not inspect.isawaitable(outcome):
        return finish(outcome)

    async def awaited() -> Any:
        try:
            result = await outcome
        except Exception as exc:
            raise translate_error(exc, doing) from exc
        return finish(result)

    return awaited()


def register(client: Any, region: Any, name: str | None = None) -> Any:
    """Register the whole of *region* with the server behind *client*.

    Returns the name (for an aio client, an awaitable of it).  *name*
    defaults to the region's key without its slash.  System regions use the
    system shared-memory extension; CUDA regions the CUDA one.
    """
    if region.closed:
        region.span()  # raises RegionClosed with the region's description
    name = default_name(region) if name is None else name
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"a registration name must be a non-empty str, not {name!r}")
    doing = f"registering {region!r} as {name!r}"

    def remember(_: Any) -> str:
        with _lock:
            _region_names[region] = name
            _own_names.add(name)
        return name

    if _is_cuda(region):
        handle = region.ipc_handle
        if ".http" in type(client).__module__:
            import base64

            handle = base64.b64encode(handle)
        return _call(
            client, doing, "register_cuda_shared_memory",
            name, handle, region.device, region.nbytes, on_success=remember,
        )
    return _call(
        client, doing, "register_system_shared_memory",
        name, region.key, region.nbytes, 0, on_success=remember,
    )


def unregister(client: Any, name_or_region: Any) -> Any:
    """Unregister one of our regions, by name or by region; idempotent.

    Refuses names this process did not register: tritonshm never removes
    other clients' regions, and never unregisters "all".
    """
    if isinstance(name_or_region, str):
        name = name_or_region
        cuda = False
    else:
        registered = registered_name(name_or_region)
        if registered is None:
            return _done(client, None)  # never registered: nothing to do
        name = registered
        cuda = _is_cuda(name_or_region)
    if not name:
        raise RegistrationError("refusing to unregister without a name: that would remove every client's regions")
    with _lock:
        ours = name in _own_names
    if not ours:
        raise RegistrationError(
            f"{name!r} was not registered by this process; tritonshm only unregisters its own regions"
        )
    method = "unregister_cuda_shared_memory" if cuda else "unregister_system_shared_memory"

    # The region keeps its name: it may still be registered with another
    # server, and a request naming it here gets the server's clear error.
    return _call(client, f"unregistering {name!r}", method, name)


def _done(client: Any, value: Any) -> Any:
    """*value*, or an awaitable of it for an aio client."""
    if not _is_aio(client):
        return value

    async def ready() -> Any:
        return value

    return ready()


def status(client: Any, name: str | None = None) -> Any:
    """The server's system shared-memory regions as ``{name: {key, offset, byte_size}}``.

    With *name*, only that region (a missing one raises
    :class:`RegionNotRegistered`).  For an aio client, an awaitable.
    """
    doing = "reading shared-memory status" if name is None else f"reading the status of {name!r}"
    # gRPC replies with a protobuf unless asked for JSON; HTTP always does JSON.
    kwargs = {"as_json": True} if ".grpc" in type(client).__module__ else {}
    return _call(client, doing, "get_system_shared_memory_status", name or "",
                 on_success=_regions_of, **kwargs)


def _regions_of(reply: Any) -> dict[str, dict[str, Any]]:
    """Normalise gRPC (``{"regions": {name: {...}}}``) and HTTP (``[{...}]``) replies."""
    if isinstance(reply, dict):
        entries = reply.get("regions", {})
        items = entries.values() if isinstance(entries, dict) else entries
    else:
        items = reply or []
    regions = {}
    for entry in items:
        regions[entry["name"]] = {
            "key": entry.get("key", ""),
            "offset": int(entry.get("offset", 0)),
            "byte_size": int(entry.get("byte_size", entry.get("byteSize", 0))),
        }
    return regions


def _binding_name(region: Any, name: str | None) -> str:
    if region.closed:
        region.span()  # raises RegionClosed
    bound = name if name is not None else registered_name(region)
    if bound is None:
        raise RegistrationError(
            f"{region!r} is not registered: call tritonshm.register(client, region) first"
        )
    return bound


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
    off, length = region.span(offset, nbytes)
    infer_input.set_shared_memory(bound, length, off)


def bind_output(requested_output: Any, region: Any, offset: int = 0, nbytes: int | None = None,
                *, name: str | None = None) -> None:
    """Make the server write *requested_output* into *region* at *offset*.

    *nbytes* (the room given to the output) defaults to the rest of the
    region.  The range is checked against the region before anything is sent.
    """
    bound = _binding_name(region, name)
    off, length = region.span(offset, nbytes)
    requested_output.set_shared_memory(bound, length, off)
