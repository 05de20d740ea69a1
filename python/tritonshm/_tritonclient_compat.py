"""Every private name of tritonclient that tritonshm uses, and nowhere else.

tritonshm builds a request once and sends it many times, and reads a gRPC stream by request id:
both need tritonclient's request builders, its gRPC error translation, and a gRPC client's stub
and metadata, which tritonclient does not make public.  Every other module calls the functions
here; :data:`CONTRACT` says what each one expects of tritonclient, and
``tests/packaging/test_tritonclient_contract.py`` checks it against the installed release (CI
installs the newest), so a release that renames or reshapes one fails that test by name.

tritonclient releases monthly, so tritonshm does not cap it: a release that breaks a private name
is met at run time, once per name, with one :class:`TritonclientChanged` warning, and the public
path where there is one -- the error translation, compression and metadata made here as
tritonclient makes them; the facades' ``InferInput`` no longer keeps arrays, and a facade call
whose request objects cannot be read goes out as tritonclient's own call.  The request builders
and the gRPC stub have no public equivalent: a call that needs one raises
:class:`TritonclientIncompatible`, naming the release and what to install.

Imports happen on first use: importing tritonclient.grpc costs ~0.3 s.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from typing import Any, Callable, NamedTuple, NoReturn

from .errors import InferenceServerException

__all__ = ["CONTRACT", "Private", "TritonclientChanged", "TritonclientIncompatible", "usable", "grpc_request",
           "http_request", "grpc_error", "raise_grpc_error", "grpc_compression", "grpc_stub", "grpc_raw_infer",
           "grpc_infer_response", "grpc_metadata",
           "grpc_parts", "with_grpc_stub", "tensor_of", "input_content", "reads_request_objects", "input_class", "result_class", "note_binary_size"]


class TritonclientChanged(UserWarning):
    """The installed tritonclient lacks (or reshaped) a private name tritonshm uses: the public
    path is taken instead (said once per name)."""


class TritonclientIncompatible(InferenceServerException):
    """The installed tritonclient lacks a private name that tritonshm has no public path around."""


class Private(NamedTuple):
    """One private name and how tritonshm calls it: ``module.qualname(*positional, **keywords)``."""

    module: str
    qualname: str                 #: "Class.method" for a method (called with the instance first)
    positional: int               #: how many arguments are passed by position (self included)
    keywords: tuple[str, ...]     #: the names passed by keyword


_GRPC_REQUEST_KEYWORDS = ("model_name", "inputs", "model_version", "request_id", "outputs", "sequence_id",
                          "sequence_start", "sequence_end", "priority", "timeout", "parameters")
_HTTP_REQUEST_KEYWORDS = ("inputs", "request_id", "outputs", "sequence_id", "sequence_start", "sequence_end",
                          "priority", "timeout", "custom_parameters")

#: What tritonshm expects of tritonclient's private names.  A gRPC client's ``_client_stub``
#: (an instance attribute, with ``ModelInfer`` and ``ModelStreamInfer``) is checked on a client.
CONTRACT: tuple[Private, ...] = (
    Private("tritonclient.grpc._utils", "_get_inference_request", 0, _GRPC_REQUEST_KEYWORDS),
    Private("tritonclient.grpc._utils", "get_error_grpc", 1, ()),
    Private("tritonclient.grpc._utils", "raise_error_grpc", 1, ()),
    Private("tritonclient.grpc._utils", "_grpc_compression_type", 1, ()),
    Private("tritonclient.http._utils", "_get_inference_request", 0, _HTTP_REQUEST_KEYWORDS),
    Private("tritonclient.grpc", "InferenceServerClient._get_metadata", 2, ()),
    Private("tritonclient.grpc.aio", "InferenceServerClient._get_metadata", 2, ()),
    # The facades (tritonshm.grpc / .http) read what a user's request objects say, without
    # changing them: their tensor description (a protobuf / a dict) and their data.
    Private("tritonclient.grpc", "InferInput._get_tensor", 1, ()),
    Private("tritonclient.grpc", "InferInput._get_content", 1, ()),
    Private("tritonclient.grpc", "InferRequestedOutput._get_tensor", 1, ()),
    Private("tritonclient.http", "InferInput._get_tensor", 1, ()),
    Private("tritonclient.http", "InferInput._get_binary_data", 1, ()),
    Private("tritonclient.http", "InferRequestedOutput._get_tensor", 1, ()),
)


def _tritonclient_version() -> str:
    from importlib.metadata import version

    try:
        return version("tritonclient")
    except Exception:  # pragma: no cover -- an install without metadata
        return "(unknown version)"


@functools.cache
def usable(module: str, qualname: str) -> bool:
    """Whether the installed tritonclient has ``module.qualname`` as :data:`CONTRACT` says (one
    :class:`TritonclientChanged` warning, the first time, where it does not).  Checked once."""
    [private] = [p for p in CONTRACT if (p.module, p.qualname) == (module, qualname)]
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        inspect.signature(target).bind(*[None] * private.positional, **{name: None for name in private.keywords})
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        warnings.warn(f"tritonclient {_tritonclient_version()} has no {module}.{qualname} as tritonshm knows it "
                      f"({type(exc).__name__}: {exc}); tritonshm takes the public path instead where it has one",
                      TritonclientChanged, stacklevel=3)
        return False
    return True


def _needed(module: str, qualname: str, what: str) -> None:
    """Raise :class:`TritonclientIncompatible` unless ``module.qualname`` is :func:`usable`
    (*what* says what needs it)."""
    if not usable(module, qualname):
        raise TritonclientIncompatible(
            msg=f"{what} needs tritonclient's {module}.{qualname}, which tritonclient {_tritonclient_version()} no "
                f"longer has as tritonshm knows it: install a release tritonshm was tested with "
                f"(pip install 'tritonclient[grpc,http]<={_TESTED}') or a newer tritonshm")


#: The newest tritonclient release tests/packaging/test_tritonclient_contract.py passed on here.
_TESTED = "2.73"


def grpc_request(**keywords: Any) -> Any:
    """tritonclient.grpc's ``ModelInferRequest`` for these keywords (every one of
    ``_GRPC_REQUEST_KEYWORDS``): what its ``infer`` sends."""
    _needed("tritonclient.grpc._utils", "_get_inference_request", "building a gRPC inference request")
    from tritonclient.grpc._utils import _get_inference_request

    return _get_inference_request(**keywords)


def http_request(**keywords: Any) -> tuple[bytes, int | None]:
    """tritonclient.http's request body and JSON size for these keywords (every one of
    ``_HTTP_REQUEST_KEYWORDS``): what its ``infer`` sends."""
    _needed("tritonclient.http._utils", "_get_inference_request", "building an HTTP inference request")
    from tritonclient.http._utils import _get_inference_request

    return _get_inference_request(**keywords)


def grpc_error(rpc_error: Any) -> Any:
    """tritonclient's ``InferenceServerException`` for a ``grpc.RpcError`` (status, details)."""
    if not usable("tritonclient.grpc._utils", "get_error_grpc"):
        return _grpc_error_made_here(rpc_error)
    from tritonclient.grpc._utils import get_error_grpc

    return get_error_grpc(rpc_error)


def _grpc_error_made_here(rpc_error: Any) -> Any:
    """:func:`grpc_error` as tritonclient 2.70-2.73 make it, from the public exception class."""
    return InferenceServerException(msg=rpc_error.details(), status=str(rpc_error.code()),
                                    debug_details=rpc_error.debug_error_string())


def _raise_grpc_error_made_here(rpc_error: Any) -> NoReturn:
    raise _grpc_error_made_here(rpc_error) from None


def raise_grpc_error(rpc_error: Any) -> NoReturn:
    """Raise :func:`grpc_error` of *rpc_error*, as tritonclient's own calls do."""
    grpc_parts()[2](rpc_error)
    raise AssertionError("raise_error_grpc returned")  # pragma: no cover -- it always raises


def grpc_compression(algorithm: str | None) -> Any:
    """gRPC's ``Compression`` value for tritonclient's name of an algorithm (None: none)."""
    if not usable("tritonclient.grpc._utils", "_grpc_compression_type"):
        import grpc

        return {"deflate": grpc.Compression.Deflate, "gzip": grpc.Compression.Gzip}.get(
            (algorithm or "").lower(), grpc.Compression.NoCompression)
    from tritonclient.grpc._utils import _grpc_compression_type

    return _grpc_compression_type(algorithm)


def grpc_stub(client: Any) -> Any:
    """The ``GRPCInferenceServiceStub`` of a tritonclient gRPC client, blocking or aio."""
    stub = getattr(client, "_client_stub", None)
    if stub is None:
        raise TritonclientIncompatible(
            msg=f"streaming needs a tritonclient gRPC client's _client_stub, which tritonclient "
                f"{_tritonclient_version()} no longer has: install a release tritonshm was tested with "
                f"(pip install 'tritonclient[grpc,http]<={_TESTED}') or a newer tritonshm")
    return stub


def grpc_raw_infer(client: Any) -> Any:
    """``ModelInfer`` on the channel of a tritonclient gRPC client (blocking or aio) that takes a
    request's bytes and answers the response's bytes, unparsed; None where the client's calls are
    not its channel's (a stub of a test's in its place: :func:`with_grpc_stub`) or it has none."""
    from tritonclient.grpc import service_pb2_grpc

    channel = getattr(client, "_channel", None)
    if channel is None or type(getattr(client, "_client_stub", None)) is not service_pb2_grpc.GRPCInferenceServiceStub:
        return None
    return channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")


@functools.cache
def grpc_infer_response() -> Any:
    """tritonclient's ``ModelInferResponse`` protobuf class (imported once, on first use)."""
    from tritonclient.grpc import service_pb2

    return service_pb2.ModelInferResponse


def with_grpc_stub(client: Any, stub: Any) -> Any:
    """*client* (a tritonclient gRPC client, blocking or aio) with its calls carried out by *stub*
    -- the service's methods, named and called as ``GRPCInferenceServiceStub``'s -- instead of
    its channel, which stays unused until the client closes it: a server in this process (a
    test's fake Triton, tests/support/fake_triton.py).  Returns *client*."""
    grpc_stub(client)  # it has one to replace, where tritonshm and tritonclient look for it
    client._client_stub = stub
    return client


def grpc_metadata(client: Any, headers: Any) -> Any:
    """The gRPC metadata a tritonclient gRPC client sends with *headers* (and its own)."""
    return grpc_metadata_of(client)(headers)


def grpc_metadata_of(client: Any) -> Callable[[Any], Any]:
    """What makes the gRPC metadata a tritonclient gRPC client sends with some headers (and its
    own: a plugin's too, so it is asked per request), bound once."""
    get_metadata = getattr(client, "_get_metadata", None)
    if get_metadata is None:
        aio = type(client).__module__.startswith("tritonclient.grpc.aio")
        usable("tritonclient.grpc.aio" if aio else "tritonclient.grpc", "InferenceServerClient._get_metadata")  # warns
        return lambda headers: tuple((str(key).lower(), value) for key, value in (headers or {}).items()) or None
    return get_metadata


@functools.cache
def grpc_parts() -> tuple[Any, Any, Any]:
    """grpc, tritonclient's InferResult and its ``raise_error_grpc``: imported once, on first use
    (the per-request send path reads them from here)."""
    import grpc
    from tritonclient.grpc import InferResult

    if not usable("tritonclient.grpc._utils", "raise_error_grpc"):
        return grpc, InferResult, _raise_grpc_error_made_here
    from tritonclient.grpc._utils import raise_error_grpc

    return grpc, InferResult, raise_error_grpc


def reads_request_objects(http: bool) -> bool:
    """Whether the facades can read tritonclient's ``InferInput`` / ``InferRequestedOutput`` of
    the protocol (:func:`tensor_of`, :func:`input_content`): else each facade call is
    tritonclient's own, and its ``InferInput`` keeps no array."""
    module = "tritonclient.http" if http else "tritonclient.grpc"
    content = "InferInput._get_binary_data" if http else "InferInput._get_content"
    return all(usable(module, name) for name in ("InferInput._get_tensor", content,
                                                  "InferRequestedOutput._get_tensor"))


def tensor_of(request_object: Any) -> Any:
    """What a tritonclient ``InferInput`` or ``InferRequestedOutput`` (gRPC or HTTP) says of its
    tensor: gRPC's protobuf message (``.parameters`` a map of ``InferParameter``), HTTP's dict
    (``"parameters"``, and ``"data"`` for JSON inputs) -- what its client's ``infer`` sends.
    Only where :func:`reads_request_objects`."""
    return request_object._get_tensor()


def input_content(infer_input: Any, http: bool) -> bytes | None:
    """The raw bytes ``set_data_from_numpy`` left on a tritonclient ``InferInput`` (serialized as
    tritonclient sends them: BYTES length-prefixed, BF16 as 2-byte words), or None (no data, JSON
    data over HTTP, or bound to shared memory).  Only where :func:`reads_request_objects`."""
    return infer_input._get_binary_data() if http else infer_input._get_content()


def note_binary_size(infer_input: Any, nbytes: int) -> None:
    """Say in a tritonclient.http ``InferInput``'s tensor description that its binary data is
    *nbytes* long (what ``set_data_from_numpy`` notes there; a gRPC input has no such note).
    Only where :func:`reads_request_objects`."""
    tensor = infer_input._get_tensor()
    if isinstance(tensor, dict):
        tensor["parameters"]["binary_data_size"] = nbytes


def input_class(mixin: type, base: type, http: bool, module: str) -> type:
    """A class ``InferInput`` of *module* (a facade's): *mixin* (its doc the class's) over
    tritonclient's ``InferInput`` *base*, whose data, where tritonclient's request builder
    reads it (gRPC ``_get_content``, HTTP ``_get_binary_data``), is the mixin's
    ``kept_bytes()`` when it kept an array, else tritonclient's own."""
    hook = "_get_binary_data" if http else "_get_content"
    theirs = getattr(base, hook)

    def content(self: Any) -> Any:
        kept = self.kept_bytes()
        return kept if kept is not None else theirs(self)

    return type("InferInput", (mixin, base), {"__doc__": mixin.__doc__, "__module__": module,
                                              "__qualname__": "InferInput", hook: content})


@functools.cache
def result_class(mixin: type, base: type) -> type:
    """A class of *mixin* over tritonclient's ``InferResult`` *base* (its name, module and doc
    are the mixin's), whose inherited ``get_output`` and ``get_response`` read the response the
    mixin's ``_make_response()`` builds, on first use: tritonclient keeps the server's response
    as ``_result``, and this class makes that a property.  Its results pickle (for multiprocessing
    and caches, as tritonclient.http's do; tritonclient.grpc's do not) with their own copy of the
    data; one class per pair."""

    def response(self: Any) -> Any:
        made = self.__dict__.get("_made_response")
        if made is None:
            made = self.__dict__["_made_response"] = self._make_response()
        return made

    def reduce(self: Any) -> tuple[Any, ...]:
        # The class has no name pickle can import (it is made here): pickled as the pair that makes
        # it again, and the state but the response, which is made again from it on use (a gRPC
        # response would not pickle: its protobuf class names a module that does not import).
        state = {key: value for key, value in self.__dict__.items() if key != "_made_response"}
        return _unpickled_result, (mixin, base, state)

    return type(mixin.__name__, (mixin, base), {"__doc__": mixin.__doc__, "__module__": mixin.__module__,
                                                "__qualname__": mixin.__qualname__,
                                                "_result": property(response), "__reduce__": reduce})


def _unpickled_result(mixin: type, base: type, state: dict[str, Any]) -> Any:
    """A :func:`result_class` result from its pickled *state*."""
    cls: Any = result_class(mixin, base)
    result = cls.__new__(cls)
    result.__dict__.update(state)
    return result
