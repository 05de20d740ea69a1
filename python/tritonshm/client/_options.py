"""Per-request options: one typed, checked value with tritonclient's names and meanings.

    opts = RequestOptions.of(parameters={"temperature": 0.5}, priority=1, timeout=200_000,
                             headers={"authorization": "Bearer ..."}, sequence_id=42,
                             sequence_start=True)
    client.infer(model, inputs, **opts.grpc_infer_kwargs())         # tritonclient.grpc (and .aio)
    client.infer(model, inputs, **opts.http_infer_kwargs())         # tritonclient.http (and .aio)
    client.start_stream(callback, **opts.grpc_start_stream_kwargs())
    client.async_stream_infer(model, inputs, **opts.grpc_stream_infer_kwargs())

Everything is checked when the value is made, before anything is sent: an unknown name or a
value of the wrong type raises :class:`~tritonshm.InvalidOptionType` (a ``TypeError``), a value
out of range :class:`~tritonshm.InvalidOption` (a ``ValueError``); both name the option.
tritonclient itself lets several of these through silently (an unknown compression algorithm,
``sequence_start`` without a ``sequence_id``) or fails late, inside gRPC (an upper-case header
name, a non-ASCII header value).

What each option means, and where it goes (tritonclient 2.40+, Triton 2.51):

=========================  ===================================================================
``parameters``             request parameters the model reads (``request.parameters()`` in a
                           Python model): str -> bool, int (64-bit), float (finite) or str.
                           Names tritonclient reserves are refused: ``sequence_id``,
                           ``sequence_start``, ``sequence_end``, ``priority``, ``timeout``,
                           ``headers``, ``binary_data_output`` and every ``triton_*``.
``priority``               the request's priority level, int >= 0: 1 is the highest, 0 the
                           model's default.  Only a model whose dynamic batcher has
                           ``priority_levels`` orders by it; a level above them counts as the
                           default.
``timeout``                server-side, in microseconds (int >= 0; tritonclient's meaning, on
                           :class:`~tritonshm.Client`'s calls too): how long the request may
                           wait in the model's queue.  Only a dynamic or sequence batcher with
                           a queue policy acts on it (``REJECT``: the request fails with
                           "Request timeout expired"), and a request may only shorten the
                           queue's default timeout, never lengthen it.
``client_timeout``         client-side, in seconds (> 0): how long the client waits for the
                           response.  tritonclient.grpc's unary ``infer`` / ``async_infer`` take
                           it; tritonclient.http and stream requests have no per-request
                           client timeout, so there the caller enforces it (it is in neither
                           :meth:`~RequestOptions.http_infer_kwargs` nor
                           :meth:`~RequestOptions.grpc_stream_infer_kwargs`).
``headers``                HTTP headers / gRPC metadata: names are made lower-case (gRPC
                           refuses others; HTTP names ignore case) and must be ``0-9 a-z - _
                           .``; values printable ASCII.  A server started with
                           ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern``
                           hands matching headers to the model as request parameters.  On a
                           gRPC stream they belong to the stream, not to a request.
``compression_algorithm``  gRPC only: compress the request, ``"gzip"`` or ``"deflate"``.  On a
                           stream it belongs to the stream.
``request_compression_``   HTTP only: compress the request body (``Content-Encoding``),
``algorithm``              ``"gzip"`` or ``"deflate"``.
``response_compression_``  HTTP only: ask for a compressed response body
``algorithm``              (``Accept-Encoding``), ``"gzip"`` or ``"deflate"``.
``sequence_id``            the correlation id of a stateful model's sequence: int in
                           [0, 2**63) or str; 0 and "" mean no sequence.  (The HTTP protocol
                           takes ids up to 2**64 - 1, tritonclient.grpc only signed 64-bit ones:
                           the common range is the one accepted.)
``sequence_start``         this request starts the sequence (bool); needs a ``sequence_id``.
``sequence_end``           this request ends the sequence (bool); needs a ``sequence_id``.
``idempotent``             tritonshm's own: whether running the request twice does no harm
                           (``None``, the default: yes, unless it is in a sequence).  Over
                           HTTP a request may go once more on a fresh connection when a kept
                           one turns out closed before any byte of an answer came (the server
                           most likely never saw it); one that is not idempotent -- ``False``,
                           or any request in a sequence, whose state would advance twice --
                           never goes twice.  ``True`` in a sequence is refused.  gRPC never
                           sends a request twice (tritonclient sets no retry policy; gRPC's
                           transparent retries only resend what never reached the server), so
                           there it changes nothing.  Not a tritonclient option: in none of
                           the kwargs methods (:attr:`~RequestOptions.idempotent` is read by
                           the HTTP wire itself).
=========================  ===================================================================

A protocol-only option given for the other protocol is refused by that protocol's kwargs method
(:class:`~tritonshm.InvalidOption`) rather than dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union

import numpy as np

from ..errors import InvalidOption, InvalidOptionType

__all__ = ["RequestOptions", "ParameterValue", "RESERVED_PARAMETERS", "RESERVED_PARAMETER_PREFIX",
           "check_slot_timeout"]

#: The type of one request parameter's value.
ParameterValue = Union[bool, int, float, str]

#: Request parameter names tritonclient refuses (``tritonclient.utils.TRITON_RESERVED_REQUEST_PARAMS``):
#: the server reads them as the request's own fields, so they are options of their own here.
RESERVED_PARAMETERS = frozenset({
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
    "binary_data_output",
})
#: Request parameter names starting with this are Triton's (``triton_enable_empty_final_response``, ...).
RESERVED_PARAMETER_PREFIX = "triton_"

#: The compression algorithms tritonclient knows, for gRPC and for HTTP alike.
COMPRESSION_ALGORITHMS = ("gzip", "deflate")

# gRPC metadata keys: lower-case letters, digits, '-', '_' and '.' (all of them HTTP token
# characters too).  Values: printable ASCII (0x20-0x7e), which both transports carry as is.
_HEADER_NAME = re.compile(r"[0-9a-z_.\-]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
# Headers the transports write themselves: one given here would clash with theirs.
_TRANSPORT_HEADERS = frozenset({
    "content-type", "content-length", "content-encoding", "accept-encoding", "transfer-encoding",
    "inference-header-content-length", "host", "connection", "te", "upgrade",
})

_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63
_UINT64_END = 1 << 64

_NAMES = ("parameters", "priority", "timeout", "client_timeout", "headers", "compression_algorithm",
          "request_compression_algorithm", "response_compression_algorithm", "sequence_id",
          "sequence_start", "sequence_end", "idempotent")
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_DEFAULTS = {
    "parameters": _EMPTY, "priority": 0, "timeout": None, "client_timeout": None, "headers": _EMPTY,
    "compression_algorithm": None, "request_compression_algorithm": None,
    "response_compression_algorithm": None, "sequence_id": 0, "sequence_start": False,
    "sequence_end": False, "idempotent": None,
}
_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<unset>"})()


def _type_name(value: Any) -> str:
    return type(value).__name__


def _wrong_type(option: str, expected: str, value: Any) -> InvalidOptionType:
    return InvalidOptionType(f"{option} must be {expected}, not {_type_name(value)} ({value!r})")


def _is_int(value: Any) -> bool:
    """An int or a numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    """A bool or a numpy bool."""
    return isinstance(value, (bool, np.bool_))


def _is_float(value: Any) -> bool:
    """A float or a numpy floating-point scalar."""
    return isinstance(value, (float, np.floating))


def _utf8(option: str, text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidOption(f"{option} is not valid UTF-8 text ({text!r}: {exc.reason})") from None
    return text


def _check_parameters(value: Any) -> Mapping[str, ParameterValue]:
    if not isinstance(value, Mapping):
        raise _wrong_type("parameters", "a mapping of str to bool, int, float or str", value)
    checked: dict[str, ParameterValue] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidOptionType(f"parameters: names must be str, not {_type_name(key)} ({key!r})")
        if not key:
            raise InvalidOption("parameters: a name must not be empty")
        _utf8(f"parameters: the name {key!r}", key)
        if key in RESERVED_PARAMETERS or key.startswith(RESERVED_PARAMETER_PREFIX):
            own = f"; use the {key} option" if key in _NAMES else ""
            raise InvalidOption(f"parameters: {key!r} is reserved by Triton (reserved: "
                                f"{', '.join(sorted(RESERVED_PARAMETERS))} and every "
                                f"'{RESERVED_PARAMETER_PREFIX}*' name){own}")
        where = f"parameters[{key!r}]"
        if _is_bool(item):
            checked[key] = bool(item)
        elif _is_int(item):
            item = int(item)
            if not _INT64_MIN <= item < _INT64_END:
                raise InvalidOption(f"{where} = {item} does not fit in 64 bits (signed)")
            checked[key] = item
        elif _is_float(item):
            item = float(item)
            if not math.isfinite(item):
                raise InvalidOption(f"{where} = {item} is not finite (JSON, which HTTP carries "
                                    f"parameters in, has no NaN or infinity)")
            checked[key] = item
        elif isinstance(item, str):
            checked[key] = _utf8(where, item)
        else:
            raise _wrong_type(where, "bool, int, float or str", item)
    return MappingProxyType(checked)


def _check_headers(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise _wrong_type("headers", "a mapping of str to str", value)
    checked: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str):
            raise InvalidOptionType(f"headers: names must be str, not {_type_name(name)} ({name!r})")
        if not isinstance(item, str):
            raise _wrong_type(f"headers[{name!r}]", "str", item)
        lower = name.lower()
        if not _HEADER_NAME.fullmatch(lower):
            raise InvalidOption(f"headers: {name!r} is not a header name gRPC and HTTP both take "
                                f"(letters, digits, '-', '_' and '.')")
        if lower.startswith("grpc-") or lower.endswith("-bin"):
            raise InvalidOption(f"headers: {name!r} is gRPC's own ('grpc-*' names are reserved, "
                                f"'*-bin' ones carry binary values)")
        if lower in _TRANSPORT_HEADERS:
            raise InvalidOption(f"headers: {name!r} is set by the transport itself")
        if lower in checked:
            raise InvalidOption(f"headers: {name!r} is given twice (names ignore case)")
        if not _HEADER_VALUE.fullmatch(item):
            raise InvalidOption(f"headers[{name!r}] = {item!r}: values must be printable ASCII")
        checked[lower] = item
    return MappingProxyType(checked)


def _check_compression(option: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong_type(option, "None, 'gzip' or 'deflate'", value)
    if value.lower() not in COMPRESSION_ALGORITHMS:
        raise InvalidOption(f"{option} must be None, 'gzip' or 'deflate', not {value!r}")
    return value.lower()


#: The longest wait in seconds a timeout may name (about 68 years): past about 2**32 s a gRPC
#: deadline (now plus the timeout, in int64 nanoseconds) and Python's lock waits overflow -- a
#: call that "waits for ever" would fail at once, as timed out.  None is for ever.
LONGEST_WAIT = float(2 ** 31)


def check_slot_timeout(value: Any) -> float | None:
    """*value* as a wait for a slot: None (for ever) or a finite number of seconds >= 0."""
    if value is None:
        return None
    if not (_is_int(value) or _is_float(value)):
        raise _wrong_type("slot_timeout", "None or a number of seconds >= 0", value)
    if not (math.isfinite(value) and 0 <= value <= LONGEST_WAIT):
        raise InvalidOption(f"slot_timeout must be None (for ever) or a number of seconds from 0 to 2**31, not "
                            f"{value!r} (the server's timeout, in microseconds, is timeout=)")
    return float(value)


def _check(name: str, value: Any) -> Any:
    """*value* of option *name*, checked and normalized."""
    if name == "parameters":
        return _check_parameters(value)
    if name == "headers":
        return _check_headers(value)
    if name in ("compression_algorithm", "request_compression_algorithm", "response_compression_algorithm"):
        return _check_compression(name, value)
    if name == "priority":
        if not _is_int(value):
            raise _wrong_type(name, "an int >= 0", value)
        if not 0 <= int(value) < _UINT64_END:
            raise InvalidOption(f"priority must be >= 0 (and below 2**64), not {value}")
        return int(value)
    if name == "timeout":
        if value is None:
            return None
        if not _is_int(value):
            # 0.5 or 2.5 can only be seconds: the wait for a slot, which has a name of its own.
            raise InvalidOptionType(
                f"timeout is the server's timeout in microseconds (tritonclient's meaning): None or an "
                f"int >= 0, not {_type_name(value)} ({value!r}); the client's wait for a slot, in seconds, "
                f"is slot_timeout=")
        if not 0 <= int(value) < _INT64_END:
            raise InvalidOption(f"timeout must be >= 0 microseconds (and below 2**63), not {value}")
        return int(value)
    if name == "client_timeout":
        if value is None:
            return None
        if not (_is_int(value) or _is_float(value)):
            raise _wrong_type(name, "None or a number of seconds > 0", value)
        if not (math.isfinite(value) and 0 < value <= LONGEST_WAIT):
            raise InvalidOption(f"client_timeout must be None (for ever) or a number of seconds above 0, at most "
                                f"2**31, not {value}")
        return float(value)
    if name == "sequence_id":
        if isinstance(value, str):
            return _utf8(name, value)
        if not _is_int(value):
            raise _wrong_type(name, "an int >= 0 or a str", value)
        if not 0 <= int(value) < _INT64_END:
            raise InvalidOption(f"sequence_id must be >= 0 and below 2**63, not {value}")
        return int(value)
    if name in ("sequence_start", "sequence_end"):
        if not _is_bool(value):
            raise _wrong_type(name, "a bool", value)
        return bool(value)
    if name == "idempotent":
        if value is None:
            return None
        if not _is_bool(value):
            raise _wrong_type(name, "None or a bool", value)
        return bool(value)
    raise AssertionError(name)  # pragma: no cover -- _NAMES and this function go together


@dataclass(frozen=True, init=False, eq=False)
class RequestOptions:
    """Per-request options, checked once (see the module's documentation for each one's meaning).

    Immutable and hashable.  ``RequestOptions()`` is "nothing asked": every option at
    tritonclient's default.  :attr:`given` remembers which options were given explicitly (even at
    their default value), so that :meth:`merged` lets exactly those override a client's defaults;
    two values are equal when their options and :attr:`given` are.  Mappings are read-only
    copies, header names lower-case, numpy scalars plain Python numbers.
    """

    parameters: Mapping[str, ParameterValue]   #: request parameters the model reads (str -> bool, int, float or str)
    priority: int                              #: the request's priority level: 1 the highest, 0 the model's default
    timeout: int | None                        #: how long the request may wait in the server's queue, in microseconds
    client_timeout: float | None               #: how long the client waits for the response, in seconds
    headers: Mapping[str, str]                 #: HTTP headers / gRPC metadata (names lower-case)
    compression_algorithm: str | None          #: gRPC only: compress the request ("gzip" or "deflate")
    request_compression_algorithm: str | None  #: HTTP only: compress the request body ("gzip" or "deflate")
    response_compression_algorithm: str | None  #: HTTP only: ask for a compressed response body
    sequence_id: int | str                     #: a stateful model's sequence (int or str; 0 and "": none)
    sequence_start: bool                       #: this request starts the sequence
    sequence_end: bool                         #: this request ends the sequence
    idempotent: bool | None                    #: tritonshm's own: whether running the request twice does no harm
    given: frozenset[str]                      #: the options given explicitly (even at their default value)

    def __init__(self, *, parameters: Mapping[str, ParameterValue] = _UNSET, priority: int = _UNSET,
                 timeout: int | None = _UNSET, client_timeout: float | None = _UNSET,
                 headers: Mapping[str, str] = _UNSET, compression_algorithm: str | None = _UNSET,
                 request_compression_algorithm: str | None = _UNSET,
                 response_compression_algorithm: str | None = _UNSET, sequence_id: int | str = _UNSET,
                 sequence_start: bool = _UNSET, sequence_end: bool = _UNSET,
                 idempotent: bool | None = _UNSET) -> None:
        given = {name: value for name, value in (
            ("parameters", parameters), ("priority", priority), ("timeout", timeout),
            ("client_timeout", client_timeout), ("headers", headers),
            ("compression_algorithm", compression_algorithm),
            ("request_compression_algorithm", request_compression_algorithm),
            ("response_compression_algorithm", response_compression_algorithm),
            ("sequence_id", sequence_id), ("sequence_start", sequence_start),
            ("sequence_end", sequence_end), ("idempotent", idempotent)) if value is not _UNSET}
        for name in _NAMES:
            value = _check(name, given[name]) if name in given else _DEFAULTS[name]
            object.__setattr__(self, name, value)
        object.__setattr__(self, "given", frozenset(given))
        if not self.in_sequence and (self.sequence_start or self.sequence_end):
            flags = " and ".join(f for f in ("sequence_start", "sequence_end") if getattr(self, f))
            raise InvalidOption(f"{flags} {'need' if ' and ' in flags else 'needs'} a sequence_id "
                                f"(an int > 0 or a non-empty str); "
                                f"sequence_id is {self.sequence_id!r}")
        if self.in_sequence and self.idempotent:
            raise InvalidOption(f"idempotent=True with sequence_id={self.sequence_id!r}: a request in a "
                                f"sequence advances the model's state, so it is never sent twice")

    @classmethod
    def of(cls, options: RequestOptions | Mapping[str, Any] | None = None, /,
           **kwargs: Any) -> RequestOptions:
        """Options from keyword arguments (tritonclient's names), from a mapping of them, or
        an existing value as is (*kwargs*, if any, replacing some of its options).

        An unknown name raises :class:`~tritonshm.InvalidOptionType` listing the known ones.
        """
        if options is None:
            base: dict[str, Any] = {}
        elif isinstance(options, RequestOptions):
            if not kwargs:
                return options
            base = {name: getattr(options, name) for name in options.given}
        elif isinstance(options, Mapping):
            base = dict(options)
        else:
            raise _wrong_type("options", "None, a RequestOptions or a mapping of option names", options)
        base.update(kwargs)
        unknown = sorted(str(name) for name in base if name not in _NAMES)
        if unknown:
            raise InvalidOptionType(f"unknown request option{'s' if len(unknown) > 1 else ''} "
                                    f"{', '.join(map(repr, unknown))}; the options are {', '.join(_NAMES)}")
        return cls(**base)

    def replace(self, **kwargs: Any) -> RequestOptions:
        """A copy with the options in *kwargs* replaced (and counted as given)."""
        return RequestOptions.of(self, **kwargs)

    def merged(self, per_call: RequestOptions | None) -> RequestOptions:
        """These options (a client's defaults) with *per_call*'s given ones on top.

        An option *per_call* gave explicitly replaces this one's -- but ``headers`` and
        ``parameters`` are merged name by name, *per_call*'s value winning for a name in both.
        The result is checked again (``sequence_start`` from one side needs a ``sequence_id``
        from either).
        """
        if per_call is None:
            return self
        if not isinstance(per_call, RequestOptions):
            raise _wrong_type("per_call", "a RequestOptions or None", per_call)
        if not per_call.given:
            return self
        options = {name: getattr(self, name) for name in self.given}
        for name in per_call.given:
            value = getattr(per_call, name)
            if name in ("headers", "parameters") and name in options:
                value = {**options[name], **value}
            options[name] = value
        return RequestOptions(**options)

    # -- what the server sees ------------------------------------------------

    @property
    def in_sequence(self) -> bool:
        """True when the request belongs to a sequence (a non-zero, non-empty ``sequence_id``)."""
        return self.sequence_id not in (0, "")

    @property
    def may_run_twice(self) -> bool:
        """Whether running the request twice does no harm: not in a sequence (whose state would
        advance twice), not marked ``idempotent=False``."""
        return not self.in_sequence and self.idempotent is not False

    def _request_kwargs(self) -> dict[str, Any]:
        """The options every tritonclient inference call takes, where not at their defaults."""
        kwargs: dict[str, Any] = {}
        if self.in_sequence:
            kwargs.update(sequence_id=self.sequence_id, sequence_start=self.sequence_start,
                          sequence_end=self.sequence_end)
        if self.priority:
            kwargs["priority"] = self.priority
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        if self.parameters:
            kwargs["parameters"] = dict(self.parameters)
        return kwargs

    def _refuse(self, protocol: str, names: tuple[str, ...], instead: str) -> None:
        wrong = [n for n in names if getattr(self, n) is not None]
        if wrong:
            raise InvalidOption(f"{' and '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not "
                                f"{protocol}'s: {instead}")

    def grpc_infer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for tritonclient.grpc's ``infer`` and ``async_infer`` (and
        ``tritonclient.grpc.aio``'s ``infer``): only the options not at their defaults.

        Fresh dicts each call (for ``headers`` and ``parameters`` too).  Raises
        :class:`~tritonshm.InvalidOption` if HTTP's compression options are set.
        """
        self._refuse("gRPC", ("request_compression_algorithm", "response_compression_algorithm"),
                     "gRPC compresses requests with compression_algorithm")
        kwargs = self._request_kwargs()
        if self.client_timeout is not None:
            kwargs["client_timeout"] = self.client_timeout
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        if self.compression_algorithm is not None:
            kwargs["compression_algorithm"] = self.compression_algorithm
        return kwargs

    def grpc_stream_infer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for one request on a gRPC stream: tritonclient.grpc's
        ``async_stream_infer`` (or a dict yielded to ``tritonclient.grpc.aio``'s
        ``stream_infer``): the sequence fields, ``priority``, ``timeout`` and ``parameters``.

        ``headers`` and ``compression_algorithm`` belong to the stream
        (:meth:`grpc_start_stream_kwargs`; requests sharing a stream share :attr:`stream_key`);
        ``client_timeout`` is the caller's to enforce.  ``enable_empty_final_response`` is not
        a request option: the caller adds it (tritonclient.grpc.aio's ``stream_infer`` ignores
        it, as of tritonclient 2.73).
        """
        self._refuse("gRPC", ("request_compression_algorithm", "response_compression_algorithm"),
                     "gRPC compresses requests with compression_algorithm")
        return self._request_kwargs()

    def grpc_start_stream_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for tritonclient.grpc's ``start_stream`` (or ``tritonclient.grpc.aio``'s
        ``stream_infer``): ``headers`` and ``compression_algorithm``, where set."""
        self._refuse("gRPC", ("request_compression_algorithm", "response_compression_algorithm"),
                     "gRPC compresses requests with compression_algorithm")
        kwargs: dict[str, Any] = {}
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        if self.compression_algorithm is not None:
            kwargs["compression_algorithm"] = self.compression_algorithm
        return kwargs

    @property
    def stream_key(self) -> tuple[tuple[tuple[str, str], ...], str | None]:
        """What a gRPC stream is opened with (headers, compression): requests whose keys differ
        cannot share one stream.  Hashable."""
        return tuple(sorted(self.headers.items())), self.compression_algorithm

    def http_infer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for tritonclient.http's ``infer`` and ``async_infer`` (and
        ``tritonclient.http.aio``'s ``infer``): only the options not at their defaults.

        Fresh dicts each call -- tritonclient.http adds its own entries to the ``headers`` dict
        it is given.  ``client_timeout`` is not among them (tritonclient.http has only the
        connection's ``network_timeout``): the caller enforces it.  Raises
        :class:`~tritonshm.InvalidOption` if gRPC's ``compression_algorithm`` is set.
        """
        self._refuse("HTTP", ("compression_algorithm",),
                     "HTTP takes request_compression_algorithm and response_compression_algorithm")
        kwargs = self._request_kwargs()
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        if self.request_compression_algorithm is not None:
            kwargs["request_compression_algorithm"] = self.request_compression_algorithm
        if self.response_compression_algorithm is not None:
            kwargs["response_compression_algorithm"] = self.response_compression_algorithm
        return kwargs

    def infer_kwargs(self, http: bool) -> dict[str, Any]:
        """:meth:`http_infer_kwargs` or :meth:`grpc_infer_kwargs`, for a client of that protocol."""
        return self.http_infer_kwargs() if http else self.grpc_infer_kwargs()

    # -- a value ---------------------------------------------------------------

    def _key(self) -> tuple:
        return tuple(
            tuple(sorted(v.items())) if isinstance(v, Mapping) else v
            for v in (getattr(self, name) for name in _NAMES)
        ) + (self.given,)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestOptions):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={dict(v) if isinstance(v, Mapping) else v!r}"
                          for name in _NAMES if name in self.given for v in (getattr(self, name),))
        return f"RequestOptions({shown})"
