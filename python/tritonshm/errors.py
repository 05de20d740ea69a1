"""The exception hierarchy of tritonshm, and the translation of server errors (the lowest layer).

Everything the library raises derives from :class:`Error`, which derives
from tritonclient's ``InferenceServerException``: code written for
tritonclient (``except InferenceServerException as e: e.status()``) catches
ours too.  Each concrete class also derives from the built-in exception a
caller would naturally catch (``ValueError`` for bad arguments, ``OSError``
for system failures, ...), so ``except ValueError`` keeps working in code
that does not know us.

:func:`translate_error` turns a failure tritonclient (or our own HTTP wire)
reports into the class of :class:`ServerError` that fits, with a message that
says what to do: one table, :data:`SERVER_ERRORS`, of (pattern, class, hint).
"""

from __future__ import annotations

import enum as _enum
import errno as _errno
import os as _os
import re as _re
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

if TYPE_CHECKING:
    class InferenceServerException(Exception):
        """What the type checker sees of tritonclient's (which ships no types): the part we use."""

        _status: str | None
        _debug_details: str | None

        def __init__(self, msg: str, status: str | None = None, debug_details: str | None = None) -> None: ...
        def message(self) -> str | None: ...
        def status(self) -> str | None: ...
        def debug_details(self) -> str | None: ...
else:
    from tritonclient.utils import InferenceServerException

__all__ = [
    "Error",
    "RegionClosed",
    "OutOfBounds",
    "DTypeMismatch",
    "ShapeMismatch",
    "NameMismatch",
    "ReadOnlyRegion",
    "UnsupportedBuffer",
    "InvalidKey",
    "SharedMemoryOSError",
    "CudaUnavailable",
    "CudaError",
    "DLPackError",
    "NotShareable",
    "ServerError",
    "ServerUnavailable",
    "ServerTimeout",
    "UnknownModel",
    "ModelChanged",
    "ServerInstallError",
    "RegistrationError",
    "RegionNotRegistered",
    "SharedMemoryRefused",
    "OutputTooSmall",
    "PoolExhausted",
    "TensorInUse",
    "ClientClosed",
    "InvalidOption",
    "InvalidOptionType",
    "DecoupledModel",
    "MalformedBytes",
    "Outcome",
    "OUTCOMES",
    "outcome_of",
]


class Error(InferenceServerException):
    """Base class of every exception tritonshm raises; a tritonclient ``InferenceServerException``.

    ``message()`` is the message (``str(exc)``, without tritonclient's
    ``"[status] "`` prefix: our messages name the cause themselves);
    ``status()`` is the server's status (gRPC's ``"StatusCode.UNAVAILABLE"``,
    ...) when the error came from a server's answer that had one, else None;
    ``debug_details()`` is the server's debug text when it sent one, else None.
    The built-in base (``ValueError``, ``OSError`` ...) takes the positional
    arguments, as it would alone: ``OSError`` subclasses keep ``errno``.
    """

    def __init__(self, *args: Any, status: str | None = None, debug_details: str | None = None):
        # tritonclient's __init__ takes (msg, status, debug_details) positionally and never
        # calls its base: skip it so the built-in base (OSError parses errno) sees the args.
        super(InferenceServerException, self).__init__(*args)
        self._status = status
        self._debug_details = debug_details

    @property
    def _msg(self) -> str:  # what tritonclient's own methods read
        return self.message()

    def message(self) -> str:
        """The message (as tritonclient's ``message()``); the same text as ``str(exc)``."""
        return super(InferenceServerException, self).__str__()

    def __str__(self) -> str:
        return self.message()


class RegionClosed(Error, ValueError):
    """An operation was attempted on a region after ``close()``."""


class OutOfBounds(Error, ValueError):
    """An offset or size (or their sum) does not fit in the region."""


class DTypeMismatch(Error, TypeError):
    """A dtype is unsupported, or does not match what the model expects."""


class ShapeMismatch(Error, ValueError):
    """A shape is invalid, or does not match what the model expects."""


class NameMismatch(ShapeMismatch):
    """An input or output name the model does not have, or an input the model needs and the
    request lacks; the message lists what the model takes.  (A :class:`ShapeMismatch`, as these
    were before they had a class of their own.)"""


class ReadOnlyRegion(Error, BufferError):
    """A write, or a writable export, was requested of a read-only mapping."""


class UnsupportedBuffer(Error, TypeError):
    """An object does not export the (C-contiguous) buffer an operation needs."""


class InvalidKey(Error, ValueError, TypeError):
    """Not a usable segment key: not a str, or not '/' then 1-254 characters without '/' or NUL."""


class SharedMemoryOSError(Error, OSError):
    """The operating system refused a shared-memory operation (carries errno)."""


class CudaUnavailable(Error, RuntimeError):
    """CUDA (cuda-python, a driver or a GPU) is not available here."""


class CudaError(Error, RuntimeError):
    """The CUDA runtime refused an operation.

    ``code`` is the ``cudaError_t`` value and ``name`` its name
    (e.g. ``"cudaErrorMemoryAllocation"``).
    """

    def __init__(self, message: str, code: int = 0, name: str = "", **details: Any):
        super().__init__(message, **details)
        self.code = code
        self.name = name


class NotShareable(UnsupportedBuffer):
    """Device memory that CUDA IPC cannot hand to another process: pool memory
    (``cudaMallocAsync``, torch's ``backend:cudaMallocAsync``), virtual-memory
    mappings (torch's ``expandable_segments``), managed memory.  The client
    copies such tensors through its own CUDA slots instead."""


class DLPackError(Error, BufferError):
    """A DLPack exchange cannot be done as asked (device, stream, copy or layout)."""


class ServerError(Error):
    """The Triton server refused a request; the message says what to do.

    ``outcome``: where the request ended (:class:`Outcome`), set by a wire that knows it
    (tritonshm's own HTTP wire does); None: read from :data:`OUTCOMES` (:func:`outcome_of`).
    """

    #: Where the request ended (:class:`Outcome`), where the wire that raised this knew it; None:
    #: :func:`outcome_of` reads :data:`OUTCOMES`.
    outcome: "Outcome | None" = None

    #: The server's own message, as tritonclient's ``message()`` gave it, where this was made from
    #: one (:func:`translate_error`); None for a failure tritonshm named itself.  What
    #: tritonshm.grpc / .http raise in tritonclient's words.
    said: "str | None" = None


class ServerUnavailable(ServerError, ConnectionError):
    """The Triton server could not be reached or is not ready."""


class ServerTimeout(ServerError, TimeoutError):
    """The server did not answer within the request's ``client_timeout``."""


class UnknownModel(ServerError, LookupError):
    """The server has no model of that name (or version); the message lists the ones it has."""


class ModelChanged(ServerError):
    """The model changed on the server since the client read it -- an output's datatype or
    shape, its outputs, the version that ran -- seen in the server's answer, before any of it
    was read.  The client has forgotten what it knew of the model (the next call reads it
    again); a request that could not run again safely (a sequence step, ``idempotent=False``,
    a zero-copy ``request()``) raises this, the message saying what changed."""

    def __init__(self, *args: Any, model: str = "", **details: Any):
        super().__init__(*args, **details)
        self.model = model  #: the model that changed


def unknown_model(exc: ServerError, model: str, names: list[str], shown: int = 12) -> "UnknownModel":
    """*exc*, the server's "unknown model" for *model*, saying which models it has (*names*)."""
    doing, _, said = str(exc).partition(": ")
    listed = ", ".join(repr(n) for n in names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown
                                                          else "")
    hint = (f"the server has no model {model!r}; it has {listed}" if names
            else f"the server has no model {model!r}, nor any other: its repository is empty or unread")
    error = UnknownModel(f"{doing}: {hint}. Server said: {said}", status=exc.status(),
                         debug_details=exc.debug_details())
    error.said = exc.said  # (tritonshm.grpc / .http raise the server's own words)
    return error


#: The server's words for a model it does not have (metadata, config, inference).
UNKNOWN_MODEL = _re.compile(r"unknown model", _re.IGNORECASE)


class ServerInstallError(ServerUnavailable):
    """No local Triton server can be installed here, or the existing install named cannot be used.

    Raised for what the machine lacks or what its settings get wrong -- no
    package index, no ``venv`` module, no backend stub for the server's
    Python, a ``$TRITONSHM_TRITONSERVER`` that does not exist, a server
    Python with numpy 2 -- and when the server's executable cannot be run
    at all. Not raised when a server that did run fails (a model that does
    not load, a startup timeout): those are plain
    :class:`~tritonshm.errors.ServerUnavailable`. The first line of the
    message says what is missing; the lines after it, if any, are details
    (the end of pip's output).
    """


class RegistrationError(ServerError, ValueError):
    """Registering or binding a shared-memory region failed."""


class RegionNotRegistered(RegistrationError):
    """The server does not know a region we reference (unregistered, or restarted)."""


class SharedMemoryRefused(RegistrationError):
    """The server cannot open our memory (not co-located, or client shm disabled)."""


class OutputTooSmall(RegistrationError):
    """The room bound for an output is smaller than the result.

    ``output`` names the output and ``needed`` is the size the server asked
    for, in bytes (None when the server did not say).
    """

    def __init__(self, message: str, output: str | None = None, needed: int | None = None, **details: Any):
        super().__init__(message, **details)
        self.output = output
        self.needed = needed


class PoolExhausted(Error, TimeoutError):
    """No slot could be had: in-flight requests kept every slot busy for the
    whole timeout, or growing the pool would pass ``max_pool_bytes``; the
    message says which."""


class TensorInUse(Error, TimeoutError):
    """A tensor given to a request is memory that an earlier request may still read or write
    -- one the client gave up on (``client_timeout``, cancelled, closed) while the server ran
    it -- and the server was not done with it within the request's ``slot_timeout``."""


class ClientClosed(Error, ValueError):
    """A closed :class:`~tritonshm.Client` (or a closed request of one) was used."""


class InvalidOption(Error, ValueError):
    """A client option or call argument has no valid meaning (a bad URL,
    transport, slot count, or a combination that cannot be honoured)."""


class InvalidOptionType(InvalidOption, TypeError):
    """A client option or call argument is of the wrong type, or is not an option at all
    (an unknown name); an :class:`InvalidOption` that is also a ``TypeError``."""


class DecoupledModel(InvalidOption):
    """The model is decoupled (any number of responses per request): Triton answers it over a
    gRPC stream only -- ``stream()``, not ``infer()`` or ``request()``.  Raised after the client
    read the model again (it may have been reloaded decoupled, or no longer be)."""


class MalformedBytes(Error, ValueError):
    """A serialized BYTES tensor is truncated or its lengths run past its end."""


def os_error(err: int, what: str, key: str | None = None) -> SharedMemoryOSError:
    """Build a :class:`SharedMemoryOSError` for ``errno`` *err* while doing *what*.

    The message carries the strerror text and a hint for the usual causes.
    """
    hint = ""
    if err == _errno.ENOSPC or err == _errno.ENOMEM:
        hint = " (is /dev/shm large enough? Docker's default is 64 MB: use --shm-size)"
    elif err == _errno.EACCES:
        hint = " (segments are created mode 0600: only their owner's user may attach)"
    elif err == _errno.ENOENT:
        hint = " (no such segment: it was closed by its owner, or lives in another IPC namespace)"
    exc = SharedMemoryOSError(err, f"{what}: {_os.strerror(err)}{hint}")
    if key is not None:
        exc.filename = key
    return exc


# -- the translation of server errors -------------------------------------------------------------

#: Why a server may refuse to open our CUDA memory; its own error only says "invalid args".
CUDA_REFUSAL_CAUSES = (
    "the server runs on another machine, or in a container without --ipc=host "
    "(CUDA IPC needs the same machine and IPC namespace); "
    "the server runs in this same process (CUDA cannot open a handle in the process that "
    "exported it); the server is a CPU-only build or cannot see that GPU (device_id is in the "
    "server's numbering: CUDA_VISIBLE_DEVICES may differ); or, where this server has opened "
    "this process's CUDA memory before, the server still maps an earlier allocation at the same "
    "address (memory freed while the server had it open: a registration it refused -- Triton "
    "keeps those open -- or one not unregistered before its memory was freed): restart the server"
)


class ServerErrorRule(NamedTuple):
    """One row of :data:`SERVER_ERRORS`: what a server's error looks like, what it becomes."""

    pattern: "_re.Pattern[str]"  #: searched in the server's message (case-insensitive)
    cls: type[ServerError]       #: the class raised
    hint: str                    #: what to do; ``{name}`` takes the pattern's named groups
    status: "_re.Pattern[str] | None" = None  #: or searched in the server's status instead
    fields: Callable[["_re.Match[str]"], dict[str, Any]] | None = None  #: extra constructor arguments
    #: a guess at the cause, read from the message (and where the client looked, if known): said last
    more: Callable[[str, str | None], str] | None = None


def _rule(pattern: str, cls: type[ServerError], hint: str, status: str | None = None,
          fields: Callable[["_re.Match[str]"], dict[str, Any]] | None = None,
          more: Callable[[str, str | None], str] | None = None) -> ServerErrorRule:
    return ServerErrorRule(_re.compile(pattern, _re.IGNORECASE), cls, hint,
                           None if status is None else _re.compile(status, _re.IGNORECASE), fields, more)


# gRPC's words for an address that answers, but not in HTTP/2 (an HTTP/1.1 server: Triton's HTTP port).
_GRPC_ADDRESS = _re.compile(r"ipv[46]:(?P<address>\[[^\]]*\]:\d+|[^\s:]+:\d+): socket closed", _re.I)
# tritonclient.http's (geventhttpclient's) words for an answer that is not HTTP/1.x (Triton's gRPC port).
_NOT_HTTP = "expected http/"


# Every client's words for a server it could not reach: gRPC's, tritonclient.http's (gevent: an
# OSError's), aiohttp's (the aio HTTP client), name resolution's; and answers in the wrong protocol.
_UNREACHABLE = ("failed to connect|connection refused|socket closed|expected http/|cannot connect to host"
                "|connect call failed|name or service not known|temporary failure in name resolution"
                "|nodename nor servname|no route to host|connection reset|network is unreachable")
# Where the client looked, as the messages above name it (gRPC: "ipv4:host:port"; aiohttp: "host h:p").
_ADDRESS_SAID = _re.compile(r"(?:ipv[46]:|connect to host )(?P<address>\[[^\]]*\]:\d+|[^\s:\[]+:\d+)", _re.I)


def _wrong_port_hint(message: str, address: str | None = None) -> str:
    """A hint for the usual cause of *message*, a connection failure: one protocol's client given
    the server's port of the other, else no server there (at the address the message names, else
    at *address*, where the client looked)."""
    grpc_at_http = _GRPC_ADDRESS.search(message)
    if grpc_at_http is not None:
        address = grpc_at_http["address"]
        return (f"; is {address} the server's HTTP port? A gRPC client (an address without a scheme) "
                f"needs its gRPC port; for HTTP, give http://{address}")
    if _NOT_HTTP in message.lower():
        return ("; the address does not answer HTTP/1.1: is it the server's gRPC port? For gRPC, give the "
                "address as host:port, without http://")
    said = _ADDRESS_SAID.search(message)
    return no_server_hint(said["address"] if said is not None else address)


def no_server_hint(address: str | None) -> str:
    """What to say after "cannot reach the Triton server" (at *address*, where known)."""
    where = f"at {address}" if address else "at that address"
    return (f"; is a Triton server running {where}? `tritonshm server --grpc-port 8001 --http-port 8000` "
            f"starts one here, on Triton's usual ports")


#: The server's errors that mean something we can say more about, first match wins.  Anything
#: else becomes a plain :class:`ServerError` with the server's message.
SERVER_ERRORS: tuple[ServerErrorRule, ...] = (
    _rule("client shared memory is disabled", SharedMemoryRefused,
          "the server has client shared memory disabled; start it with --allow-client-shm=true (Triton >= 2.69)"),
    # --grpc-restricted-protocol / --http-restricted-api: gRPC names the header with its
    # "triton-grpc-protocol-" prefix, as the client must send it.
    _rule(r"this (protocol|api) is restricted, expecting header '(?P<header>[^']+)'", SharedMemoryRefused,
          "the server restricts its shared-memory API to callers that send header {header!r}: give it "
          "in the client's headers= (the value the server was started with)"),
    _rule("unable to open shared memory region|unable to open cuda", SharedMemoryRefused,
          "the server cannot open our shared memory. It must run on this machine, in the same IPC "
          "namespace (--ipc=host for containers), as a user allowed to open mode-0600 segments of ours"),
    _rule("already in manager", RegistrationError,
          "the server already has a region of that name; unregister it first or pick another name"),
    _rule("unable to find.*shared memory|shared memory.*unable to find", RegionNotRegistered,
          "the server does not know this region: it was unregistered, or the server restarted since it "
          "was registered; register it again"),
    _rule(r"for output '(?P<output>[^']*)' \((?P<given>\d+) bytes\) should be at least (?P<needed>\d+) bytes",
          OutputTooSmall, "output {output!r} needs {needed} bytes but only {given} were bound; bind a larger nbytes",
          fields=lambda m: {"output": m["output"], "needed": int(m["needed"])}),
    _rule("deadline exceeded", ServerTimeout, "the server did not answer within the client_timeout",
          status="deadline_exceeded"),
    _rule("request timeout expired", ServerTimeout,
          "the request waited in the model's queue longer than its timeout (microseconds, the server's)"),
    _rule(_UNREACHABLE, ServerUnavailable, "cannot reach the Triton server", status="unavailable",
          more=_wrong_port_hint),
)

# A CUDA registration's refusals all read "invalid args" (the cause is only in the server's log),
# or "GPUs not supported" on CPU-only builds.
_CUDA_REFUSED = _rule("", SharedMemoryRefused,
                      f"the server cannot open our CUDA memory. Likely causes: {CUDA_REFUSAL_CAUSES}")
_CONNECTION = _rule("", ServerUnavailable, "cannot reach the Triton server", more=_wrong_port_hint)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def translate_error(exc: BaseException, doing: str, *, cuda: bool = False, address: str | None = None) -> ServerError:
    """Turn a tritonclient failure (or our HTTP wire's) into the :class:`ServerError` that says
    what to do: ``"<doing>: <hint>. Server said: <message>[; <a guess at the cause>]"``, with the
    server's ``status()`` and ``debug_details()`` carried over.

    *cuda* marks a CUDA registration, whose refusals the server reports as a generic
    "invalid args".  *address* is where the client looked (its URL), named in the hint where
    the failure's own message does not say it (a refused HTTP connection: "[Errno 111]").
    A tritonshm error is returned as it is.
    """
    if isinstance(exc, ServerError):
        return exc
    # tritonclient's InferenceServerException has message(), status() and debug_details().
    message_of = getattr(exc, "message", None)
    status_of = getattr(exc, "status", None)
    details_of = getattr(exc, "debug_details", None)
    message = (message_of() if callable(message_of) else "") or str(exc)
    status = _text(status_of()) if callable(status_of) else None
    details = _text(details_of()) if callable(details_of) else None
    match, rule = None, None
    for candidate in SERVER_ERRORS:
        match = candidate.pattern.search(message)
        if match is None and candidate.status is not None and status is not None:
            match = candidate.status.search(status)
        if match is not None:
            rule = candidate
            break
    if rule is None:
        if isinstance(exc, ConnectionError):
            rule = _CONNECTION
        elif cuda:
            rule = _CUDA_REFUSED
        else:
            plain = ServerError(f"{doing}: {message}", status=status, debug_details=details)
            plain.said = message
            return plain
    groups = match.groupdict() if match is not None else {}
    fields = rule.fields(match) if rule.fields is not None and match is not None else {}
    more = rule.more(message, address) if rule.more is not None else ""
    error = rule.cls(f"{doing}: {rule.hint.format(**groups)}. Server said: {message}{more}",
                     status=status, debug_details=details, **fields)
    if isinstance(exc, ConnectionRefusedError):
        error.outcome = Outcome.NOT_SENT  # (tritonclient.http's: nothing listens there)
    error.said = message
    return error


# -- where a failed request ended ----------------------------------------------------------


class Outcome(_enum.Enum):
    """Where a request that failed ended, as far as its memory goes: what the server may still
    read or write (a slot, the caller's lent tensors) comes back at once for the first two, and
    only once the server provably let go of it for the last (``client/_claim.py``)."""

    NOT_SENT = "never reached the server"  #: no connection carried it: nothing of it runs there
    ANSWERED = "the server's own answer"   #: Triton refused or failed it: it is done with it
    UNKNOWN = "unknown"                    #: the server may still run it


class OutcomeRule(NamedTuple):
    """One row of :data:`OUTCOMES`."""

    status: "_re.Pattern[str]"             #: matched against the error's ``status()``
    message: "_re.Pattern[str] | None"     #: and, where given, searched in its message
    outcome: Outcome
    why: str                               #: where to check it


def _outcome_rule(status: str, message: str | None, outcome: Outcome, why: str) -> OutcomeRule:
    return OutcomeRule(_re.compile(status, _re.IGNORECASE),
                       None if message is None else _re.compile(message, _re.IGNORECASE), outcome, why)


# gRPC core's words for a call that found no connection to go on (grpcio: "failed to connect to all
# addresses; last error: UNKNOWN: ipv4:127.0.0.1:8001: Failed to connect to remote host: Connection
# refused"; "DNS resolution failed for ..."): the call failed before it was started on a stream.
_NO_CONNECTION = ("failed to connect to all addresses|dns resolution failed|name or service not known"
                  "|temporary failure in name resolution|nodename nor servname")
# gRPC core's words for a stream or connection that broke under a call (not Triton's: its errors
# are its own messages): "Socket closed", "Connection reset by peer", "Stream removed", "Received
# RST_STREAM with error code 2", "Received http2 header with status: 502" (a proxy), GOAWAY.
_BROKEN_STREAM = ("socket closed|connection reset|broken pipe|stream removed|rst_stream|http2 header"
                  "|goaway|end of tcp stream|keepalive|transport closing|connection aborted")

#: How a failed request ended, read from the error when the wire that raised it did not say
#: (tritonclient's gRPC errors, whose ``status()`` is ``"StatusCode.<NAME>"``); first match wins.
#: Triton answers with the gRPC status of its own error (``core``'s TRITONSERVER_Error codes, mapped
#: in ``server``'s src/grpc/grpc_utils.cc: INVALID_ARG -> INVALID_ARGUMENT, NOT_FOUND, INTERNAL,
#: UNAVAILABLE, UNSUPPORTED -> UNIMPLEMENTED, ALREADY_EXISTS, CANCELLED); gRPC core uses
#: UNAVAILABLE for a connection that failed or broke, and for a proxy's 502/503/504
#: (grpc/doc/http-grpc-status-mapping.md).  Where the two share a status, the answer is
#: "unknown": holding memory that the server let go of costs one unregister to find out;
#: handing back memory it still writes is a wrong answer.  Tritonshm's HTTP wire sets
#: :attr:`ServerError.outcome` itself (``_http1``): a connection never made, or a request not
#: wholly written, never arrived; an answer with Triton's JSON error body (``{"error": ...}``,
#: src/http_server.cc) is the server's, unless its status is 502 or 504, which Triton never sends;
#: anything else (a gateway's page, a timeout, a reset after the request went out) is unknown.
OUTCOMES: tuple[OutcomeRule, ...] = (
    _outcome_rule("unavailable", _NO_CONNECTION, Outcome.NOT_SENT,
                  "gRPC core found no connection to start the call on"),
    _outcome_rule("unavailable", "this protocol is restricted", Outcome.ANSWERED,
                  "Triton's refusal of a restricted API without its header (src/grpc/grpc_server.cc)"),
    _outcome_rule("unavailable|cancelled|deadline_exceeded", None, Outcome.UNKNOWN,
                  "a connection that broke, a proxy's 502/503/504, the client's deadline, a cancellation: "
                  "the request may be running on the server"),
    _outcome_rule("internal|unknown", _BROKEN_STREAM, Outcome.UNKNOWN,
                  "gRPC core's words for a broken stream, not Triton's"),
    _outcome_rule(r"^50[234]$", None, Outcome.UNKNOWN,
                  "an HTTP status a gateway in front of Triton sends when it gave up on it (tritonclient.http)"),
    _outcome_rule(".", None, Outcome.ANSWERED,
                  "any other status is Triton's answer (its error codes, src/grpc/grpc_utils.cc)"),
)


def copy_for_another_caller(exc: BaseException) -> BaseException:
    """A copy of *exc* (its attributes too, not its traceback), for one more caller to raise:
    one exception object raised by many gathers every raiser's frames in its traceback, and
    with them their requests' tensors and slots, for as long as any caller keeps it."""
    # (not copy.copy: that calls __init__ again, whose arguments need not be args -- tritonclient's
    # InferenceServerException's are not)
    twin = type(exc).__new__(type(exc), *exc.args)
    twin.args = exc.args  # (OSError's __new__ leaves them to an __init__ a subclass overrides)
    twin.__dict__.update(exc.__dict__)
    twin.__cause__, twin.__suppress_context__ = exc.__cause__, exc.__suppress_context__
    return twin


def outcome_of(exc: BaseException) -> Outcome:
    """Where the request whose sending raised *exc* ended (see :class:`Outcome`): the wire's
    word where it gave one, else :data:`OUTCOMES`; a failure that is no server error (the
    client closed, a task cancelled, an interrupt) and one without a status are unknown --
    except a shared-memory refusal (:class:`RegistrationError`: the server checks the regions
    a request names before it runs it)."""
    if not isinstance(exc, ServerError):
        return Outcome.UNKNOWN
    if exc.outcome is not None:
        return exc.outcome
    status = exc.status()
    if not status:
        return Outcome.ANSWERED if isinstance(exc, RegistrationError) else Outcome.UNKNOWN
    message = exc.message()
    for rule in OUTCOMES:
        if rule.status.search(status) and (rule.message is None or rule.message.search(message)):
            return rule.outcome
    return Outcome.UNKNOWN
