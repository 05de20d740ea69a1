"""The four ways of talking to Triton: gRPC or HTTP, blocking or asyncio.

tritonclient has a client class for each, and their calls differ in small
ways: gRPC answers with protobufs unless asked for JSON and nests a model's
config one level deeper, HTTP needs ``binary_data`` on requested outputs,
the asyncio clients return awaitables and take other constructor
arguments.  Every such difference lives in the table below; the rest of
tritonshm asks a :class:`Transport` instead of guessing from module names.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from typing import Any, Callable, Mapping

from . import _tritonclient_compat
from .errors import InvalidOption, InvalidOptionType, RegistrationError

__all__ = ["Transport", "ReadyRequest", "GRPC", "GRPC_AIO", "HTTP", "HTTP_AIO", "IN_PROCESS", "of_client", "parse_url",
           "SCHEMES", "release_gevent_hub"]

#: Servers that live in this process, by the address they answer at (``"host:port"``, as
#: :func:`parse_url` gives it): for such an address :meth:`Transport.connect` hands out what
#: ``server(transport, ssl=..., verbose=..., options=...)`` makes instead of a client of the
#: network.  Empty but in tests: tests/support/fake_triton.py puts its fake Triton here, so every
#: client tritonshm makes for that address (the drivers' connections, the finalizer's,
#: ``Client.tritonclient``) is the fake's, and everything above tritonclient's gRPC stub runs as
#: it does against a server.
IN_PROCESS: dict[str, Callable[..., Any]] = {}


@dataclasses.dataclass(frozen=True)
class Transport:
    """One of tritonclient's four client flavours."""

    protocol: str       #: "grpc" or "http"
    aio: bool           #: True for the asyncio client
    module_name: str    #: where its InferenceServerClient, InferInput, ... live

    @property
    def http(self) -> bool:
        """True for HTTP/REST."""
        return self.protocol == "http"

    @property
    def module(self) -> Any:
        """The tritonclient module (imported on first use: importing gRPC costs ~0.3 s)."""
        return importlib.import_module(self.module_name)

    @property
    def types_module(self) -> Any:
        """The module with InferInput / InferRequestedOutput (aio shares the blocking ones)."""
        return importlib.import_module(self.module_name.removesuffix(".aio"))

    def connect(self, address: str, *, ssl: bool = False, verbose: bool = False,
                options: Mapping[str, Any] | None = None) -> Any:
        """A new client for *address* ("host:port"); *options* go to its constructor as they are
        (a server of this process at that address makes it instead: :data:`IN_PROCESS`)."""
        kwargs = dict(options or {})
        server = IN_PROCESS.get(address)
        if server is not None:
            return server(self, ssl=ssl, verbose=verbose, options=kwargs)
        return self.module.InferenceServerClient(address, verbose=verbose, ssl=ssl, **kwargs)

    def owns(self, client: Any) -> bool:
        """Whether *client* is an instance of this flavour's client class.

        Looks only at modules already imported: a client of a module that
        was never imported cannot exist.
        """
        module = sys.modules.get(self.module_name)
        cls = getattr(module, "InferenceServerClient", None)
        return cls is not None and isinstance(client, cls)

    @property
    def json(self) -> dict[str, Any]:
        """Keyword arguments that make status and config calls answer JSON-like dicts."""
        return {} if self.http else {"as_json": True}

    def model_names(self, reply: Any) -> list[str]:
        """The model names in a ``get_model_repository_index`` reply, sorted (gRPC nests the
        list under "models"; HTTP answers the list)."""
        models = reply if self.http else reply.get("models", [])
        return sorted({str(model["name"]) for model in models if "name" in model})

    def model_config(self, reply: Mapping[str, Any]) -> Mapping[str, Any]:
        """The model config inside a ``get_model_config`` reply (gRPC nests it under "config")."""
        return reply if self.http else reply.get("config", reply)

    def infer_input(self, name: str, shape: list[int], datatype: str) -> Any:
        """A new ``InferInput``."""
        return self.types_module.InferInput(name, shape, datatype)

    def requested_output(self, name: str) -> Any:
        """A new ``InferRequestedOutput``; HTTP ones ask for binary data (never JSON numbers)."""
        if self.http:
            return self.types_module.InferRequestedOutput(name, binary_data=True)
        return self.types_module.InferRequestedOutput(name)


    def request_message(self, model: str, version: str, inputs: list, outputs: list) -> Any:
        """The whole inference request, made once to be sent many times: gRPC a
        :class:`ReadyRequest` (for a :meth:`sender`), HTTP an :class:`~tritonshm._http1.Prepared`
        (for :class:`~tritonshm._http1.Connections`).  *inputs* and *outputs* live in shared
        memory: no tensor travels in the message."""
        if self.http:
            from . import _http1

            return _http1.prepare(model, version, inputs, outputs)
        return ReadyRequest(_tritonclient_compat.grpc_request(
            model_name=model, inputs=inputs, model_version=version, request_id="", outputs=outputs,
            sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None))

    def sender(self, client: Any) -> Callable[[ReadyRequest], Any]:
        """What runs gRPC inference requests made ready (:meth:`request_message`) on *client*: a
        function of one, its ``InferResult`` (awaitable for aio) -- what tritonclient's ``infer``
        does once it has built the message, which is the part skipped.  Bound once per client:
        its channel's (or stub's) ``ModelInfer``, its metadata, tritonclient's result and error
        types are looked up now, not per request.  Failures are tritonclient's
        (``InferenceServerException``), as its ``infer`` raises them.

        On the client's own channel the request goes as the bytes made once, and the answer comes
        as bytes: one that is the same, byte for byte, as the last answer to that request (a
        warm request's is: the same outputs, shapes and version) is the result parsed then."""
        grpc, InferResult, raise_error_grpc = _tritonclient_compat.grpc_parts()
        metadata_of = _tritonclient_compat.grpc_metadata_of(client)
        raw_infer = _tritonclient_compat.grpc_raw_infer(client)
        if raw_infer is None:  # a stub of a test's, in this process: its messages as they are
            model_infer = _tritonclient_compat.grpc_stub(client).ModelInfer
            if self.aio:
                async def send_message_awaited(ready: ReadyRequest) -> Any:
                    try:
                        return InferResult(await model_infer(request=ready.request, metadata=metadata_of(None)))
                    except grpc.RpcError as rpc_error:
                        raise_error_grpc(rpc_error)

                return send_message_awaited

            def send_message(ready: ReadyRequest) -> Any:
                try:
                    return InferResult(model_infer(request=ready.request, metadata=metadata_of(None)))
                except grpc.RpcError as rpc_error:
                    raise_error_grpc(rpc_error)

            return send_message
        parse = _tritonclient_compat.grpc_infer_response().FromString

        def result_of(ready: ReadyRequest, answer: bytes) -> Any:
            last = ready.last
            if answer == last[0]:
                return last[1]
            result = InferResult(parse(answer))
            ready.last = (answer, result, None)  # (one assignment: a request on another thread reads one whole)
            return result

        if self.aio:
            async def send_awaited(ready: ReadyRequest) -> Any:
                try:
                    return result_of(ready, await raw_infer(ready.data, metadata=metadata_of(None)))
                except grpc.RpcError as rpc_error:
                    raise_error_grpc(rpc_error)

            return send_awaited

        def send(ready: ReadyRequest) -> Any:
            try:
                return result_of(ready, raw_infer(ready.data, metadata=metadata_of(None)))
            except grpc.RpcError as rpc_error:
                raise_error_grpc(rpc_error)

        return send


class ReadyRequest:
    """A gRPC inference request made once, to be sent many times (:meth:`Transport.request_message`):
    its ``ModelInferRequest`` (*request*), that message's bytes (*data*), and the last answer to it
    (*last*: ``(bytes, InferResult, what the client read of it)``), whose result
    :meth:`Transport.sender` hands out again for an answer that is the same -- and what was read
    of it once is known (:func:`~tritonshm.client._results.answered_shapes`).  Results are read,
    never changed, by whoever gets one."""

    __slots__ = ("request", "data", "last")

    def __init__(self, request: Any):
        self.request = request
        self.data: bytes = request.SerializeToString()
        self.last: tuple[bytes | None, Any, Any] = (None, None, None)

    def __repr__(self) -> str:
        return f"<ReadyRequest of {len(self.data)} bytes for model {self.request.model_name!r}>"


GRPC = Transport("grpc", False, "tritonclient.grpc")
GRPC_AIO = Transport("grpc", True, "tritonclient.grpc.aio")
HTTP = Transport("http", False, "tritonclient.http")
HTTP_AIO = Transport("http", True, "tritonclient.http.aio")
_ALL = (GRPC, GRPC_AIO, HTTP, HTTP_AIO)

#: scheme -> (protocol, TLS, the port when the URL names none).  gRPC and HTTP take
#: tritonclient's and PyTriton's defaults, Triton's own ports (8001, 8000); grpcs:// keeps 8001
#: (Triton serves gRPC over TLS itself, on its gRPC port), https:// takes 443 (Triton's HTTP
#: endpoint has no TLS of its own: https means a proxy in front, on the usual port).
SCHEMES: dict[str, tuple[str, bool, int]] = {
    "grpc": ("grpc", False, 8001), "grpcs": ("grpc", True, 8001),
    "http": ("http", False, 8000), "https": ("http", True, 443),
}
#: A URL without a scheme is gRPC, as tritonclient.grpc takes it.
DEFAULT_SCHEME = "grpc"
_URL_FORMS = ("expected 'host', 'host:port', 'grpc://host[:port]', 'grpcs://host[:port]', "
              "'http://host[:port]' or 'https://host[:port]' (IPv6 in brackets: '[::1]:8001'); "
              "without a port: 8001 for gRPC, 8000 for http://, 443 for https://")
# host[:port]: a name or IPv4 address, or an IPv6 address in brackets; then an optional port.
_ADDRESS = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")


def release_gevent_hub() -> None:
    """Destroy this thread's gevent hub and its loop: for a thread of ours that is ending after
    tritonclient.http calls (each thread that makes an HTTP client gets a hub, with descriptors
    of its own).  Nothing where gevent was never imported."""
    gevent = sys.modules.get("gevent")
    if gevent is not None:
        gevent.get_hub().destroy(destroy_loop=True)


def of_client(client: Any) -> Transport:
    """The flavour of a tritonclient client; :class:`RegistrationError` for anything else."""
    for transport in _ALL:
        if transport.owns(client):
            return transport
    raise RegistrationError(
        f"expected a tritonclient gRPC or HTTP InferenceServerClient (blocking or aio), "
        f"not {type(client).__name__}"
    )


def parse_url(url: str, *, aio: bool = False) -> tuple[Transport, str, bool]:
    """``(transport, "host:port", ssl)`` for a server URL -- the one place URLs are parsed.

    ``"host[:port]"`` and ``"grpc://host[:port]"`` are gRPC, ``"grpcs://"`` gRPC
    over TLS, ``"http://"`` HTTP and ``"https://"`` HTTP over TLS; a missing port
    is the scheme's default (:data:`SCHEMES`: 8001 for gRPC, 8000 for HTTP, as in
    tritonclient and PyTriton; 443 for https).  The address returned always has
    its port.  Anything else is :class:`~tritonshm.InvalidOption` naming the forms.
    """
    if not isinstance(url, str):
        raise InvalidOptionType(f"a server URL must be a str, not {type(url).__name__} ({url!r}): {_URL_FORMS}")
    if not url.strip():
        raise InvalidOption(f"a server URL must not be empty: {_URL_FORMS}")
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        scheme, rest = DEFAULT_SCHEME, url.strip()
    if scheme.lower() not in SCHEMES:
        raise InvalidOption(f"unknown scheme {scheme!r} in server URL {url!r}: {_URL_FORMS}")
    protocol, ssl, default_port = SCHEMES[scheme.lower()]
    address = _ADDRESS.fullmatch(rest.removesuffix("/"))
    if address is None:
        raise InvalidOption(f"cannot read a host and port in server URL {url!r}: {_URL_FORMS}")
    port = default_port if address["port"] is None else int(address["port"])
    if not 0 < port < 65536:
        raise InvalidOption(f"port {port} in server URL {url!r} is not in 1-65535")
    for transport in _ALL:
        if transport.protocol == protocol and transport.aio == aio:
            return transport, f"{address['host']}:{port}", ssl
    raise AssertionError("unreachable: every protocol has both flavours")
