"""Where ``tritonshm bench`` finds its server, and whether it is there.

``--url`` and ``--http-url`` are read by the parser :class:`tritonshm.Client` reads its URL with
(:func:`tritonshm._transport.parse_url`, the one parser): ``host:port`` and ``grpc://`` are gRPC,
``http://host:port`` is HTTP, a missing port is the scheme's default (8001, 8000).  Then the server
is asked, at every address given, for its version and for the bench's model, before any method
makes a client: a bad URL, nothing listening, the other protocol's port, a listener that is not
Triton and a server without the bench's models are each one :class:`~tritonshm.errors.Error` of
one line, with the hints of :mod:`tritonshm.errors`' table -- never a tritonclient traceback, and
never a tritonclient client half made from a URL it refuses (whose ``__del__`` then fails).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import _transport
from ..errors import InvalidOption, ServerError, ServerUnavailable, no_server_hint, translate_error

#: Seconds the check waits for each answer: a listener that accepts and never answers (not a
#: Triton server) fails the check rather than hanging the bench.
CHECK_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class Addresses:
    """The server's addresses for one run, each ``host:port`` with its port, or None."""

    grpc: str | None  #: None: only an HTTP address was given; the gRPC methods sit out
    http: str | None  #: None: no HTTP address; the HTTP methods sit out

    def shown(self) -> str:
        """The addresses as a user gives them: ``host:port`` (gRPC) and ``http://host:port``."""
        return " and ".join([f"{self.grpc} (gRPC)"] * (self.grpc is not None)
                            + [f"http://{self.http}"] * (self.http is not None))


def _parse(text: str, option: str) -> tuple[_transport.Transport, str, bool]:
    try:
        return _transport.parse_url(text)
    except InvalidOption as exc:
        raise InvalidOption(f"{option}: {exc}") from None


def resolve(url: str | None, http_url: str | None, *, options: tuple[str, str] = ("url", "http_url")) -> Addresses:
    """The addresses *url* and *http_url* name, read as :class:`~tritonshm.Client` reads a URL;
    :class:`~tritonshm.errors.InvalidOption` (one line, naming *options*: the two parameters'
    names, or the command's ``--url`` and ``--http-url``) for anything else.

    *url* is the server's gRPC address (``host:port``, ``grpc://host:port``) or its HTTP URL
    (``http://host:port``); *http_url* its HTTP address, ``http://host:port`` or ``host:port``
    (the one place a bare address is HTTP: the option says which protocol).
    """
    url_option, http_option = options
    if url is None and http_url is None:
        raise InvalidOption(f"no server address: give {url_option} (the server's gRPC host:port, or its "
                            f"http://host:port)")
    grpc = http = None
    if url is not None:
        wire, address, ssl = _parse(url, url_option)
        if ssl:
            # Every row builds a plain tritonclient client, without certificates: the bench measures a
            # server on this machine (shared memory needs one), where TLS would only add its own cost.
            raise InvalidOption(f"{url_option} {url}: the bench measures a server on this machine, without TLS: "
                                f"give its plain {'HTTP address (http://host:port)' if wire.http else 'gRPC address (host:port)'}")
        if not wire.http:
            grpc = address
        elif http_url is not None:
            raise InvalidOption(f"{url_option} {url} is an HTTP URL and {http_option} gives one too: "
                                f"{url_option} takes the server's gRPC address (host:port) here")
        else:
            # An HTTP URL alone: the HTTP rows (and the HTTP floor and limit) run against it and the gRPC
            # rows sit out, each saying why -- what Client does with the same URL, rather than a refusal,
            # or a gRPC port guessed from the HTTP one (8001 beside 8000 is a habit, not a rule).
            http = address
    if http_url is not None:
        wire, address, ssl = _parse(http_url if "://" in http_url else "http://" + http_url, http_option)
        if not wire.http:
            raise InvalidOption(f"{http_option} {http_url} is a gRPC URL: {http_option} takes the server's HTTP "
                                f"address (http://host:port, or host:port)")
        if ssl:
            raise InvalidOption(f"{http_option} {http_url}: the bench measures a server on this machine, without "
                                f"TLS: give its plain HTTP address (http://host:port)")
        http = address
    return Addresses(grpc, http)


def require_grpc(addresses: Addresses, mode: str) -> str:
    """The gRPC address of a mode whose methods are all gRPC (*mode*: ``"--gpu"``, ``"--stream"``);
    :class:`~tritonshm.errors.InvalidOption` when only an HTTP address was given."""
    if addresses.grpc is None:
        raise InvalidOption(f"{mode} measures over gRPC only: give the server's gRPC address as --url "
                            f"(host:port), not http://{addresses.http}")
    return addresses.grpc


def _one_line(exc: BaseException, doing: str, address: str) -> ServerUnavailable:
    """*exc*, a failure to get an answer at *address*, as one line: the translation table's
    message and hint (its first line: an answer that is not Triton's may be a whole web page),
    and where the table has no hint of its own for it, the one for no server there."""
    err = translate_error(exc, doing)
    lines = str(err).splitlines() or [doing]
    message = lines[0] + (" [...]" if len(lines) > 1 else "")
    if not isinstance(err, ServerUnavailable):  # no hint of the table's: a timeout, an answer not Triton's
        message += no_server_hint(address)
    return ServerUnavailable(message, status=err.status(), debug_details=err.debug_details())


def _ask(wire: _transport.Transport, address: str, model: str | None, timeout: float) -> str:
    """The version of the server at *address* over *wire*, which serves *model* ready (if given)."""
    shown = f"http://{address}" if wire.http else address
    protocol = "HTTP" if wire.http else "gRPC"
    # HTTP clients time out per connection and per read; gRPC's calls each take a deadline.
    options = {"connection_timeout": timeout, "network_timeout": timeout} if wire.http else {}
    deadline: dict[str, Any] = {} if wire.http else {"client_timeout": timeout}
    client = wire.connect(address, options=options)  # the address is parsed: the constructor takes it
    try:
        doing = f"asking the server at {shown} ({protocol}) for its version"
        try:
            metadata = client.get_server_metadata(**wire.json, **deadline)
            ready = model is None or client.is_model_ready(model, **deadline)
        except Exception as exc:  # noqa: BLE001 - tritonclient's, gevent's, gRPC's own types
            raise _one_line(exc, doing, address) from None
    finally:
        client.close()
    if not ready:
        raise ServerError(f"the server at {shown} has no ready model {model!r}: the bench needs tritonshm's bundled "
                          f"models (`tritonshm server` serves them; or leave --url out and the bench starts one)")
    return str(metadata.get("version", "?"))


def server_version(addresses: Addresses, model: str | None, *, timeout: float = CHECK_TIMEOUT) -> str:
    """The version of the Triton server at *addresses* (asked at each one given, gRPC first);
    :class:`~tritonshm.errors.ServerError` of one line if one cannot be reached, is not Triton
    or, given a *model*, does not serve it ready."""
    version = ""
    for wire, address in ((_transport.GRPC, addresses.grpc), (_transport.HTTP, addresses.http)):
        if address is not None:
            version = _ask(wire, address, model, timeout)
    return version


__all__ = ["Addresses", "CHECK_TIMEOUT", "resolve", "require_grpc", "server_version"]
