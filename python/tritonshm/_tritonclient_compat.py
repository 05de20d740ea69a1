"""Every private name of tritonclient that tritonshm uses, and nowhere else.

tritonshm builds a request once and sends it many times, and reads a gRPC stream by request id:
both need tritonclient's request builders, its gRPC error translation, and a gRPC client's stub
and metadata, which tritonclient does not make public.  Every other module calls the functions
here; :data:`CONTRACT` says what each one expects of tritonclient, and
``tests/packaging/test_tritonclient_contract.py`` checks it against the installed release, so
a release that renames or reshapes one fails that test by name (with the version), not a
request at run time.  pyproject.toml bounds tritonclient to the releases checked.

Imports happen on first use: importing tritonclient.grpc costs ~0.3 s.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, NoReturn

__all__ = ["CONTRACT", "Private", "grpc_request", "http_request", "grpc_error", "raise_grpc_error",
           "grpc_compression", "grpc_stub", "grpc_metadata", "grpc_parts", "tensor_of", "input_content",
           "result_class", "note_binary_size"]


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


def grpc_request(**keywords: Any) -> Any:
    """tritonclient.grpc's ``ModelInferRequest`` for these keywords (every one of
    ``_GRPC_REQUEST_KEYWORDS``): what its ``infer`` sends."""
    from tritonclient.grpc._utils import _get_inference_request

    return _get_inference_request(**keywords)


def http_request(**keywords: Any) -> tuple[bytes, int | None]:
    """tritonclient.http's request body and JSON size for these keywords (every one of
    ``_HTTP_REQUEST_KEYWORDS``): what its ``infer`` sends."""
    from tritonclient.http._utils import _get_inference_request

    return _get_inference_request(**keywords)


def grpc_error(rpc_error: Any) -> Any:
    """tritonclient's ``InferenceServerException`` for a ``grpc.RpcError`` (status, details)."""
    from tritonclient.grpc._utils import get_error_grpc

    return get_error_grpc(rpc_error)


def raise_grpc_error(rpc_error: Any) -> NoReturn:
    """Raise :func:`grpc_error` of *rpc_error*, as tritonclient's own calls do."""
    grpc_parts()[2](rpc_error)
    raise AssertionError("raise_error_grpc returned")  # pragma: no cover -- it always raises


def grpc_compression(algorithm: str | None) -> Any:
    """gRPC's ``Compression`` value for tritonclient's name of an algorithm (None: none)."""
    from tritonclient.grpc._utils import _grpc_compression_type

    return _grpc_compression_type(algorithm)


def grpc_stub(client: Any) -> Any:
    """The ``GRPCInferenceServiceStub`` of a tritonclient gRPC client, blocking or aio."""
    return client._client_stub


def grpc_metadata(client: Any, headers: Any) -> Any:
    """The gRPC metadata a tritonclient gRPC client sends with *headers* (and its own)."""
    return client._get_metadata(headers)


@functools.cache
def grpc_parts() -> tuple[Any, Any, Any]:
    """grpc, tritonclient's InferResult and its ``raise_error_grpc``: imported once, on first use
    (the per-request send path reads them from here)."""
    import grpc
    from tritonclient.grpc import InferResult
    from tritonclient.grpc._utils import raise_error_grpc

    return grpc, InferResult, raise_error_grpc


def tensor_of(request_object: Any) -> Any:
    """What a tritonclient ``InferInput`` or ``InferRequestedOutput`` (gRPC or HTTP) says of its
    tensor: gRPC's protobuf message (``.parameters`` a map of ``InferParameter``), HTTP's dict
    (``"parameters"``, and ``"data"`` for JSON inputs) -- what its client's ``infer`` sends."""
    return request_object._get_tensor()


def input_content(infer_input: Any, http: bool) -> bytes | None:
    """The raw bytes ``set_data_from_numpy`` left on a tritonclient ``InferInput`` (serialized as
    tritonclient sends them: BYTES length-prefixed, BF16 as 2-byte words), or None (no data, JSON
    data over HTTP, or bound to shared memory)."""
    return infer_input._get_binary_data() if http else infer_input._get_content()


def note_binary_size(infer_input: Any, nbytes: int) -> None:
    """Say in a tritonclient.http ``InferInput``'s tensor description that its binary data is
    *nbytes* long (what ``set_data_from_numpy`` notes there; a gRPC input has no such note)."""
    tensor = infer_input._get_tensor()
    if isinstance(tensor, dict):
        tensor["parameters"]["binary_data_size"] = nbytes


def result_class(mixin: type, base: type) -> type:
    """A class of *mixin* over tritonclient's ``InferResult`` *base* (its name, module and doc
    are the mixin's), whose inherited ``get_output`` and ``get_response`` read the response the
    mixin's ``_make_response()`` builds, on first use: tritonclient keeps the server's response
    as ``_result``, and this class makes that a property."""

    def response(self: Any) -> Any:
        made = self.__dict__.get("_made_response")
        if made is None:
            made = self.__dict__["_made_response"] = self._make_response()
        return made

    return type(mixin.__name__, (mixin, base), {"__doc__": mixin.__doc__, "__module__": mixin.__module__,
                                                "__qualname__": mixin.__qualname__,
                                                "_result": property(response)})
