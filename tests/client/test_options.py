"""RequestOptions: every check without a server; then, against the real server, each option
reaching Triton through plain tritonclient and the kwargs RequestOptions makes (the bundled
``echo_request`` model answers with what the server's Python backend saw)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import threading
import time
from decimal import Decimal

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
import tritonclient.utils

import tritonshm
from tritonshm.client._options import (COMPRESSION_ALGORITHMS, RESERVED_PARAMETER_PREFIX, RESERVED_PARAMETERS,
                                       RequestOptions)
from tritonshm.server import LocalServer
from triton_fixtures import make_client, start_or_skip

R = RequestOptions
OPTION_NAMES = ("parameters", "priority", "timeout", "client_timeout", "headers", "compression_algorithm",
                "request_compression_algorithm", "response_compression_algorithm", "sequence_id",
                "sequence_start", "sequence_end", "idempotent")


def refused(kind, match, **kwargs):
    """RequestOptions.of(**kwargs) raises *kind* (a tritonshm.Error too) whose message matches."""
    with pytest.raises(kind, match=match) as info:
        R.of(**kwargs)
    assert isinstance(info.value, tritonshm.Error)
    return info.value


# -- the value ---------------------------------------------------------------------


def test_nothing_asked():
    o = R()
    assert o == R.of() == R.of(None) == R.of({})
    assert o.given == frozenset()
    assert (o.parameters, o.priority, o.timeout, o.client_timeout, dict(o.headers)) == ({}, 0, None, None, {})
    assert (o.compression_algorithm, o.request_compression_algorithm, o.response_compression_algorithm) == \
        (None, None, None)
    assert (o.sequence_id, o.sequence_start, o.sequence_end, o.in_sequence) == (0, False, False, False)
    assert o.grpc_infer_kwargs() == o.http_infer_kwargs() == o.grpc_stream_infer_kwargs() == {}
    assert o.grpc_start_stream_kwargs() == {}
    assert repr(o) == "RequestOptions()"


def test_fields_are_tritonclients_names():
    assert tuple(f.name for f in dataclasses.fields(R)) == OPTION_NAMES + ("given",)
    assert tuple(inspect.signature(R).parameters) == OPTION_NAMES


def test_immutable_and_copies_its_mappings():
    params, headers = {"a": 1}, {"x-a": "1"}
    o = R(parameters=params, headers=headers)
    params["b"], headers["x-b"] = 2, "2"
    assert dict(o.parameters) == {"a": 1} and dict(o.headers) == {"x-a": "1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.priority = 3
    with pytest.raises(TypeError):
        o.parameters["c"] = 3
    with pytest.raises(TypeError):
        o.headers["x-c"] = "3"


def test_equality_hash_and_given():
    a = R(priority=1, parameters={"a": 1, "b": "x"}, headers={"X-A": "1"})
    b = R.of({"headers": {"x-a": "1"}, "parameters": {"b": "x", "a": 1}, "priority": 1})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.given == {"priority", "parameters", "headers"}
    assert R(priority=0) != R()  # given explicitly: it overrides a client's default when merged
    assert R(priority=0).given == {"priority"}
    assert R(priority=1) != R(priority=2)
    assert a.__eq__("priority=1") is NotImplemented


def test_repr_shows_the_given_options():
    assert repr(R(priority=2, headers={"X-A": "v"})) == "RequestOptions(priority=2, headers={'x-a': 'v'})"


def test_numpy_scalars_become_python_values():
    o = R(parameters={"i": np.int16(-3), "f": np.float32(0.5), "b": np.bool_(True)},
          priority=np.uint8(2), timeout=np.int64(10), client_timeout=np.float64(1.5),
          sequence_id=np.int32(7), sequence_start=np.bool_(True))
    assert dict(o.parameters) == {"i": -3, "f": 0.5, "b": True}
    assert [type(v) for v in o.parameters.values()] == [int, float, bool]
    assert (type(o.priority), type(o.timeout), type(o.client_timeout), type(o.sequence_id),
            type(o.sequence_start)) == (int, int, float, int, bool)


# -- of, replace, merged ------------------------------------------------------------


def test_of_takes_kwargs_a_mapping_or_an_existing_value():
    o = R.of(priority=1)
    assert R.of(o) is o
    assert R.of({"priority": 1}) == o
    assert R.of({"priority": 1}, timeout=5) == R(priority=1, timeout=5)
    assert R.of(o, timeout=5) == R(priority=1, timeout=5)
    assert R.of({"priority": 1}, priority=2).priority == 2  # keywords win over the mapping


def test_of_refuses_unknown_names():
    exc = refused(tritonshm.InvalidOptionType, r"unknown request option 'prority'; the options are parameters, ",
                  prority=1)
    assert isinstance(exc, TypeError) and isinstance(exc, tritonshm.InvalidOption)
    refused(TypeError, r"unknown request options 'model_version', 'request_id'", request_id="a", model_version="1")
    with pytest.raises(tritonshm.InvalidOptionType, match="unknown request option 'headerz'"):
        R.of({"headerz": {}})
    with pytest.raises(TypeError):  # the constructor itself: Python's own error
        R(prority=1)


def test_of_refuses_what_is_not_options():
    with pytest.raises(tritonshm.InvalidOptionType, match="options must be None, a RequestOptions or a mapping"):
        R.of([("priority", 1)])


def test_replace():
    o = R(priority=1, headers={"x-a": "1"})
    p = o.replace(priority=2)
    assert (p.priority, dict(p.headers), p.given) == (2, {"x-a": "1"}, {"priority", "headers"})
    assert o.priority == 1
    with pytest.raises(tritonshm.InvalidOption, match="priority must be >= 0"):
        o.replace(priority=-1)
    with pytest.raises(tritonshm.InvalidOptionType, match="unknown request option 'x'"):
        o.replace(x=1)


def test_merged_per_call_wins_and_mappings_merge_by_name():
    defaults = R(headers={"authorization": "a", "x-trace": "d"}, parameters={"p": 1, "q": 2}, priority=2,
                 client_timeout=10.0)
    per_call = R(headers={"X-Trace": "c"}, parameters={"q": 3}, timeout=100)
    m = defaults.merged(per_call)
    assert dict(m.headers) == {"authorization": "a", "x-trace": "c"}
    assert dict(m.parameters) == {"p": 1, "q": 3}
    assert (m.priority, m.client_timeout, m.timeout) == (2, 10.0, 100)
    assert m.given == defaults.given | per_call.given


def test_merged_explicit_default_overrides():
    defaults = R(priority=2, client_timeout=3.0)
    m = defaults.merged(R(priority=0))
    assert (m.priority, m.client_timeout) == (0, 3.0)


def test_merged_with_nothing():
    defaults = R(priority=2)
    assert defaults.merged(None) is defaults
    assert defaults.merged(R()) is defaults
    assert R().merged(defaults) == defaults
    with pytest.raises(tritonshm.InvalidOptionType, match="per_call must be a RequestOptions or None"):
        defaults.merged({"priority": 1})


def test_merged_is_checked_again():
    m = R(sequence_id=5, sequence_end=True).merged(R(sequence_id=6, sequence_start=True))
    assert (m.sequence_id, m.sequence_start, m.sequence_end) == (6, True, True)
    # the call clears the sequence the defaults' flags were for: refused
    with pytest.raises(tritonshm.InvalidOption, match="sequence_end needs a sequence_id"):
        R(sequence_id=5, sequence_end=True).merged(R(sequence_id=0))


# -- parameters --------------------------------------------------------------------------


def test_parameters_values_of_each_type():
    o = R(parameters={"b": False, "i": -(1 << 63), "j": (1 << 63) - 1, "f": -2.5, "s": "héllo", "e": ""})
    assert dict(o.parameters) == {"b": False, "i": -(1 << 63), "j": (1 << 63) - 1, "f": -2.5, "s": "héllo",
                                  "e": ""}
    assert type(o.parameters["b"]) is bool


@pytest.mark.parametrize("value", [None, b"x", [1], {"a": 1}, Decimal("1.5"), 1j, object()])
def test_parameters_refuse_other_value_types(value):
    refused(tritonshm.InvalidOptionType, r"parameters\['k'\] must be bool, int, float or str, not ",
            parameters={"k": value})


@pytest.mark.parametrize("value", [1 << 63, -(1 << 63) - 1, np.uint64((1 << 64) - 1)])
def test_parameters_refuse_ints_beyond_64_bits(value):
    refused(tritonshm.InvalidOption, r"parameters\[.k.\] = -?\d+ does not fit in 64 bits",
            parameters={"k": value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_parameters_refuse_non_finite_floats(value):
    refused(tritonshm.InvalidOption, r"parameters\['k'\] = .* is not finite", parameters={"k": value})


def test_parameters_refuse_text_that_is_not_utf8():
    refused(tritonshm.InvalidOption, r"parameters\['k'\] is not valid UTF-8", parameters={"k": "a\ud800"})
    refused(tritonshm.InvalidOption, r"parameters: the name 'a\\ud800' is not valid UTF-8",
            parameters={"a\ud800": 1})


def test_parameters_refuse_bad_names_and_containers():
    refused(tritonshm.InvalidOptionType, "parameters must be a mapping of str to bool, int, float or str, not list",
            parameters=[("a", 1)])
    refused(tritonshm.InvalidOptionType, r"parameters: names must be str, not int \(1\)", parameters={1: 1})
    refused(tritonshm.InvalidOption, "parameters: a name must not be empty", parameters={"": 1})


@pytest.mark.parametrize("name", sorted(RESERVED_PARAMETERS) + ["triton_enable_empty_final_response", "triton_x"])
def test_parameters_refuse_reserved_names(name):
    exc = refused(tritonshm.InvalidOption, f"parameters: '{name}' is reserved", parameters={name: 1})
    assert ("use the" in str(exc)) == (name in OPTION_NAMES)


def test_reserved_names_cover_tritonclients():
    assert set(tritonclient.utils.TRITON_RESERVED_REQUEST_PARAMS) <= RESERVED_PARAMETERS
    assert tritonclient.utils.TRITON_RESERVED_REQUEST_PARAMS_PREFIX == RESERVED_PARAMETER_PREFIX


# -- priority, timeout, client_timeout -------------------------------------------------------


def test_priority():
    assert R(priority=(1 << 64) - 1).priority == (1 << 64) - 1
    refused(tritonshm.InvalidOption, "priority must be >= 0 .*not -1", priority=-1)
    refused(tritonshm.InvalidOption, "priority must be >= 0 .*below 2\\*\\*64", priority=1 << 64)
    for bad in (True, 1.0, "1", None):
        refused(tritonshm.InvalidOptionType, "priority must be an int >= 0, not", priority=bad)


def test_timeout():
    assert R(timeout=0).timeout == 0 and R(timeout=None).given == {"timeout"}
    assert R(timeout=(1 << 63) - 1).timeout == (1 << 63) - 1
    refused(tritonshm.InvalidOption, "timeout must be >= 0 microseconds .*not -5", timeout=-5)
    refused(tritonshm.InvalidOption, "timeout must be >= 0 microseconds", timeout=1 << 63)
    for bad in (False, 1.5, 0.5, 1e6, "10"):  # seconds (or anything but an int) name both meanings
        refused(tritonshm.InvalidOptionType,
                r"timeout is the server's timeout in microseconds .*None or an int >= 0.*slot_timeout=", timeout=bad)


def test_client_timeout():
    assert R(client_timeout=2).client_timeout == 2.0 and type(R(client_timeout=2).client_timeout) is float
    assert R(client_timeout=0.001).client_timeout == 0.001
    assert R(client_timeout=2 ** 31).client_timeout == 2.0 ** 31  # (about 68 years)
    for bad in (0, -1, 0.0, math.nan, math.inf, 1e10):  # (past 2**31 s a gRPC deadline overflows: at once, timed out)
        refused(tritonshm.InvalidOption, "client_timeout must be None .for ever. or a number of seconds above 0, "
                "at most 2..31", client_timeout=bad)
    for bad in (True, "1", Decimal(1)):
        refused(tritonshm.InvalidOptionType, "client_timeout must be None or a number of seconds > 0",
                client_timeout=bad)


# -- headers ----------------------------------------------------------------------------


def test_headers_are_lower_cased():
    o = R(headers={"Authorization": "Bearer t0k.en", "X-Request-Trace_id.v2": "a b ~"})
    assert dict(o.headers) == {"authorization": "Bearer t0k.en", "x-request-trace_id.v2": "a b ~"}


@pytest.mark.parametrize("name", ["", "x y", "x:y", "x/y", "é", "x\n"])
def test_headers_refuse_names_outside_grpcs_alphabet(name):
    refused(tritonshm.InvalidOption, "is not a header name gRPC and HTTP both take", headers={name: "v"})


@pytest.mark.parametrize("name", ["grpc-timeout", "GRPC-x", "x-data-bin"])
def test_headers_refuse_grpcs_own(name):
    refused(tritonshm.InvalidOption, "is gRPC's own", headers={name: "v"})


@pytest.mark.parametrize("name", ["Content-Type", "content-length", "Content-Encoding", "accept-encoding",
                                  "Inference-Header-Content-Length", "host", "transfer-encoding", "te",
                                  "connection", "upgrade"])
def test_headers_refuse_what_the_transport_sets(name):
    refused(tritonshm.InvalidOption, "is set by the transport itself", headers={name: "v"})


def test_headers_refuse_a_name_twice():
    refused(tritonshm.InvalidOption, "'X-A' is given twice", headers={"x-a": "1", "X-A": "2"})


@pytest.mark.parametrize("value", ["a\nb", "tab\there", "é", "\x7f"])
def test_headers_refuse_values_outside_printable_ascii(value):
    refused(tritonshm.InvalidOption, "values must be printable ASCII", headers={"x-a": value})


def test_headers_refuse_wrong_types():
    refused(tritonshm.InvalidOptionType, "headers must be a mapping of str to str, not list", headers=[("a", "b")])
    refused(tritonshm.InvalidOptionType, "headers: names must be str, not bytes", headers={b"x": "v"})
    refused(tritonshm.InvalidOptionType, r"headers\['x'\] must be str, not int", headers={"x": 1})


# -- compression -------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["compression_algorithm", "request_compression_algorithm",
                                    "response_compression_algorithm"])
def test_compression_algorithms(option):
    for algorithm in COMPRESSION_ALGORITHMS:
        assert getattr(R.of(**{option: algorithm.upper()}), option) == algorithm
    assert getattr(R.of(**{option: None}), option) is None
    refused(tritonshm.InvalidOption, f"{option} must be None, 'gzip' or 'deflate', not 'br'", **{option: "br"})
    refused(tritonshm.InvalidOption, f"{option} must be None, 'gzip' or 'deflate', not ''", **{option: ""})
    refused(tritonshm.InvalidOptionType, f"{option} must be None, 'gzip' or 'deflate', not bool",
            **{option: True})


# -- sequences -------------------------------------------------------------------------------


def test_sequence_ids():
    assert R(sequence_id=(1 << 63) - 1, sequence_start=True).in_sequence
    assert R(sequence_id="chat-7", sequence_end=True).in_sequence
    assert not R(sequence_id=0).in_sequence and not R(sequence_id="").in_sequence
    assert not R(sequence_id=0, sequence_start=False, sequence_end=False).in_sequence
    refused(tritonshm.InvalidOption, "sequence_id must be >= 0 and below 2\\*\\*63, not -1", sequence_id=-1)
    refused(tritonshm.InvalidOption, "sequence_id must be >= 0 and below 2\\*\\*63", sequence_id=1 << 63)
    refused(tritonshm.InvalidOption, "sequence_id is not valid UTF-8", sequence_id="\udc80")
    for bad in (True, 1.0, b"id", None):
        refused(tritonshm.InvalidOptionType, "sequence_id must be an int >= 0 or a str", sequence_id=bad)


def test_sequence_flags():
    for flag in ("sequence_start", "sequence_end"):
        for bad in (1, "yes", None):
            refused(tritonshm.InvalidOptionType, f"{flag} must be a bool", **{flag: bad}, sequence_id=1)
        refused(tritonshm.InvalidOption, f"{flag} needs a sequence_id .*; sequence_id is 0", **{flag: True})
        refused(tritonshm.InvalidOption, f"{flag} needs a sequence_id .*; sequence_id is ''", **{flag: True},
                sequence_id="")
    refused(tritonshm.InvalidOption, "sequence_start and sequence_end need a sequence_id",
            sequence_start=True, sequence_end=True)


def test_idempotent():
    assert R().idempotent is None and R(idempotent=None).given == {"idempotent"}
    assert R(idempotent=np.bool_(False)).idempotent is False and R(idempotent=True).idempotent is True
    assert R(sequence_id=3, idempotent=False).idempotent is False
    for bad in (0, 1, "no"):
        refused(tritonshm.InvalidOptionType, "idempotent must be None or a bool", idempotent=bad)
    refused(tritonshm.InvalidOption, "idempotent=True with sequence_id='s': a request in a sequence .* never sent "
            "twice", sequence_id="s", idempotent=True)
    with pytest.raises(tritonshm.InvalidOption, match="idempotent=True with sequence_id=4"):
        R(idempotent=True).merged(R(sequence_id=4))  # checked again once merged
    for method in ("grpc_infer_kwargs", "http_infer_kwargs", "grpc_stream_infer_kwargs", "grpc_start_stream_kwargs"):
        assert getattr(R(idempotent=False), method)() == {}


# -- the kwargs of each tritonclient call --------------------------------------------------------


FULL = dict(parameters={"p": 1, "s": "x"}, priority=1, timeout=1000, client_timeout=2.5,
            headers={"X-A": "1"}, sequence_id=9, sequence_start=True, sequence_end=False,
            idempotent=False)  # tritonshm's own: in no tritonclient kwargs
SEQUENCE_AND_REQUEST = dict(sequence_id=9, sequence_start=True, sequence_end=False, priority=1, timeout=1000,
                            parameters={"p": 1, "s": "x"})


def test_grpc_infer_kwargs():
    o = R(**FULL, compression_algorithm="gzip")
    assert o.grpc_infer_kwargs() == {**SEQUENCE_AND_REQUEST, "client_timeout": 2.5, "headers": {"x-a": "1"},
                                     "compression_algorithm": "gzip"}


def test_grpc_stream_kwargs():
    o = R(**FULL, compression_algorithm="deflate")
    assert o.grpc_stream_infer_kwargs() == SEQUENCE_AND_REQUEST  # no headers, compression, client_timeout
    assert o.grpc_start_stream_kwargs() == {"headers": {"x-a": "1"}, "compression_algorithm": "deflate"}
    assert o.stream_key == ((("x-a", "1"),), "deflate")
    assert R(headers={"b": "2", "a": "1"}).stream_key == R(headers={"a": "1", "b": "2"}).stream_key
    assert R(**SEQUENCE_AND_REQUEST).stream_key == R().stream_key == ((), None)
    assert hash(o.stream_key) is not None


def test_http_infer_kwargs():
    o = R(**FULL, request_compression_algorithm="gzip", response_compression_algorithm="deflate")
    assert o.http_infer_kwargs() == {**SEQUENCE_AND_REQUEST, "headers": {"x-a": "1"},
                                     "request_compression_algorithm": "gzip",
                                     "response_compression_algorithm": "deflate"}  # no client_timeout


def test_sequence_fields_only_in_a_sequence():
    kwargs = R(sequence_id=0, sequence_start=False).grpc_infer_kwargs()
    assert kwargs == {}
    assert R(sequence_id="s").http_infer_kwargs() == {"sequence_id": "s", "sequence_start": False,
                                                     "sequence_end": False}


def test_kwargs_are_fresh_each_call():
    o = R(headers={"x-a": "1"}, parameters={"p": 1})
    for method in (o.grpc_infer_kwargs, o.http_infer_kwargs, o.grpc_start_stream_kwargs, o.grpc_stream_infer_kwargs):
        first, second = method(), method()
        for key in set(first) & {"headers", "parameters"}:
            assert first[key] is not second[key] and type(first[key]) is dict
            first[key]["added"] = "by tritonclient"  # tritonclient.http adds its own headers
    assert dict(o.headers) == {"x-a": "1"} and dict(o.parameters) == {"p": 1}


def test_each_protocol_refuses_the_others_compression():
    for method in ("grpc_infer_kwargs", "grpc_stream_infer_kwargs", "grpc_start_stream_kwargs"):
        for option in ("request_compression_algorithm", "response_compression_algorithm"):
            with pytest.raises(tritonshm.InvalidOption, match=f"{option} is not gRPC's"):
                getattr(R.of(**{option: "gzip"}), method)()
    with pytest.raises(tritonshm.InvalidOption,
                       match="request_compression_algorithm and response_compression_algorithm are not gRPC's"):
        R(request_compression_algorithm="gzip", response_compression_algorithm="gzip").grpc_infer_kwargs()
    with pytest.raises(tritonshm.InvalidOption, match="compression_algorithm is not HTTP's: HTTP takes "):
        R(compression_algorithm="gzip").http_infer_kwargs()


_EVERYTHING = R(**FULL)


@pytest.mark.parametrize("function, kwargs", [
    (tritonclient.grpc.InferenceServerClient.infer, _EVERYTHING.replace(compression_algorithm="gzip").grpc_infer_kwargs()),
    (tritonclient.grpc.InferenceServerClient.async_infer,
     _EVERYTHING.replace(compression_algorithm="gzip").grpc_infer_kwargs()),
    (tritonclient.grpc.aio.InferenceServerClient.infer,
     _EVERYTHING.replace(compression_algorithm="gzip").grpc_infer_kwargs()),
    (tritonclient.grpc.InferenceServerClient.async_stream_infer, _EVERYTHING.grpc_stream_infer_kwargs()),
    (tritonclient.grpc.InferenceServerClient.start_stream,
     _EVERYTHING.replace(compression_algorithm="gzip").grpc_start_stream_kwargs()),
    (tritonclient.grpc.aio.InferenceServerClient.stream_infer,
     _EVERYTHING.replace(compression_algorithm="gzip").grpc_start_stream_kwargs()),
    (tritonclient.http.InferenceServerClient.infer,
     _EVERYTHING.replace(request_compression_algorithm="gzip", response_compression_algorithm="gzip").http_infer_kwargs()),
    (tritonclient.http.InferenceServerClient.async_infer,
     _EVERYTHING.replace(request_compression_algorithm="gzip", response_compression_algorithm="gzip").http_infer_kwargs()),
    (tritonclient.http.aio.InferenceServerClient.infer,
     _EVERYTHING.replace(request_compression_algorithm="gzip", response_compression_algorithm="gzip").http_infer_kwargs()),
], ids=lambda v: getattr(v, "__qualname__", "") if callable(v) else "")
def test_tritonclient_takes_the_kwargs(function, kwargs):
    """Every key each method makes is a keyword of the tritonclient function it is for."""
    assert kwargs
    params = inspect.signature(function).parameters
    assert set(kwargs) <= set(params), set(kwargs) - set(params)


# -- against the real server: each option reaches Triton --------------------------------------


def _echo(module, client, options: RequestOptions, rows=1, **extra):
    """Run echo_request with *options* over *client*; (what the server saw, OUTPUT1)."""
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    i0 = module.InferInput("INPUT0", list(x.shape), "FP32")
    i0.set_data_from_numpy(x)
    grpc = module is tritonclient.grpc
    kwargs = options.grpc_infer_kwargs() if grpc else options.http_infer_kwargs()
    result = client.infer("echo_request", [i0], **kwargs, **extra)
    seen = [json.loads(s) for s in result.as_numpy("OUTPUT0")[:, 0]]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x)
    assert all(s == seen[0] for s in seen)
    return seen[0]


def test_parameters_priority_timeout_and_sequence_reach_the_server(triton_client):
    module, client = triton_client
    compression = ({"compression_algorithm": "gzip"} if module is tritonclient.grpc
                   else {"request_compression_algorithm": "gzip", "response_compression_algorithm": "deflate"})
    options = R(parameters={"text": "héllo", "count": -(1 << 40), "ratio": 0.25, "flag": True}, priority=1,
                timeout=30_000_000, sequence_id=1234, sequence_start=True, **compression)
    seen = _echo(module, client, options, rows=2)
    assert seen["parameters"] == {"text": "héllo", "count": -(1 << 40), "ratio": 0.25, "flag": True}
    assert seen["timeout"] == 30_000_000
    assert seen["correlation_id"] == 1234 and seen["flags"] == 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


def test_string_sequence_id_and_end_flag_reach_the_server(triton_client):
    module, client = triton_client
    seen = _echo(module, client, R(sequence_id="chat-42", sequence_end=True))
    assert seen["correlation_id"] == "chat-42" and seen["flags"] == 2  # ..._SEQUENCE_END
    seen = _echo(module, client, R(sequence_id=7, sequence_start=True, sequence_end=True))
    assert seen["correlation_id"] == 7 and seen["flags"] == 3


def test_nothing_asked_reaches_the_server_as_nothing(triton_client):
    module, client = triton_client
    seen = _echo(module, client, R())
    assert (seen["parameters"], seen["correlation_id"], seen["flags"], seen["timeout"]) == ({}, 0, 0, 0)


def _in_thread(srv, protocol, work):
    """``work(module, client)`` in a thread of its own with a client of its own; returns the thread.

    tritonclient.http runs on a gevent hub per thread: the thread destroys its hub when done, so
    its descriptors do not outlive the test.
    """
    def target():
        module, client = make_client(srv, protocol)
        try:
            work(module, client)
        finally:
            client.close()
            if protocol == "http":
                import gevent

                gevent.get_hub().destroy(destroy_loop=True)

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_server_rejects_a_request_whose_timeout_passes_in_the_queue(server, protocol):
    """echo_request's queue policy rejects a request that waited longer than its ``timeout``."""
    outcome = {}

    def run(name, options):
        def work(module, client):
            try:
                outcome[name] = _echo(module, client, options)
            except tritonclient.utils.InferenceServerException as exc:
                outcome[name] = exc
        return _in_thread(server, protocol, work)

    threads = [run("holder", R(parameters={"delay_ms": 600}))]
    time.sleep(0.2)  # the holder runs; what comes next waits in the queue
    threads += [run("short", R(timeout=50_000)), run("long", R(timeout=30_000_000))]  # 50 ms, 30 s
    for t in threads:
        t.join()
    assert isinstance(outcome["short"], tritonclient.utils.InferenceServerException)
    assert "Request timeout expired" in str(outcome["short"])
    assert outcome["long"]["timeout"] == 30_000_000 and outcome["holder"]["parameters"] == {"delay_ms": 600}


def test_priority_orders_the_queue(server, protocol):
    """With the instance busy, a queued priority-1 request runs before priority-2 ones sent earlier."""
    seen = {}

    def run(name, options):
        return _in_thread(server, protocol,
                          lambda module, client: seen.__setitem__(name, _echo(module, client, options)["order"]))

    threads = [run("holder", R(parameters={"delay_ms": 600}))]
    time.sleep(0.2)
    for name, options in (("low", R(priority=2)), ("default", R()), ("beyond", R(priority=9)), ("high", R(priority=1))):
        threads.append(run(name, options))
        time.sleep(0.05)  # in this order into the queue
    for t in threads:
        t.join()
    assert seen["holder"] < seen["high"] < min(seen["low"], seen["default"], seen["beyond"])
    # the same level (2: the default, and 9 counts as the default) keeps arrival order
    assert seen["low"] < seen["default"] < seen["beyond"]


def test_grpc_stream_kwargs_reach_the_server(server):
    """A request on a gRPC stream (echo_request is not decoupled: one response, final) carries its
    options; the stream's own (headers, compression) go to start_stream."""
    import queue

    module, client = make_client(server, "grpc")
    responses = queue.Queue()
    options = R(parameters={"k": "v"}, timeout=20_000_000, sequence_id="st-1", sequence_start=True,
                headers={"x-who": "test"}, compression_algorithm="deflate", priority=1)
    try:
        client.start_stream(lambda result, error: responses.put((result, error)), **options.grpc_start_stream_kwargs())
        x = np.ones((1, 2), np.float32)
        i0 = module.InferInput("INPUT0", [1, 2], "FP32")
        i0.set_data_from_numpy(x)
        client.async_stream_infer("echo_request", [i0], request_id="r-1", **options.grpc_stream_infer_kwargs())
        result, error = responses.get(timeout=10)
        assert error is None
        seen = json.loads(result.as_numpy("OUTPUT0")[0, 0])
        assert (seen["parameters"], seen["timeout"], seen["correlation_id"], seen["flags"], seen["request_id"]) == \
            ({"k": "v"}, 20_000_000, "st-1", 1, "r-1")
        assert result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
        client.close()


# -- headers: a server that hands x-echo-* headers to the model ----------------------------------


@pytest.fixture(scope="module")
def header_server():
    """A server of this module's own with only echo_request, forwarding ``x-echo-*`` headers to it
    as request parameters (Triton does that only when asked, per protocol)."""
    srv = LocalServer(quiet=True, extra_args=[
        "--model-control-mode=explicit", "--load-model=echo_request",
        "--grpc-header-forward-pattern=^x-echo-.*", "--http-header-forward-pattern=^x-echo-.*"])
    with start_or_skip(srv):
        from triton_fixtures import _warm_up_tritonclient

        _warm_up_tritonclient(srv.http_url, srv.grpc_url)
        yield srv


@pytest.mark.server
def test_grpc_client_timeout_ends_the_wait(header_server):
    """On this module's server: a client deadline cancels the request on the server, and Triton
    before 2.57 has races in gRPC cancellation (server issues 7368, 8034) that can take it down."""
    module, client = make_client(header_server, "grpc")
    try:
        t0 = time.monotonic()
        with pytest.raises(tritonclient.utils.InferenceServerException, match="Deadline Exceeded") as info:
            _echo(module, client, R(client_timeout=0.1, parameters={"delay_ms": 500}))
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED" and time.monotonic() - t0 < 0.45
    finally:
        client.close()
    time.sleep(0.5)  # the abandoned request finishes before the next test


@pytest.mark.server
def test_headers_reach_the_server(header_server, protocol):
    module, client = make_client(header_server, protocol)
    try:
        defaults = R(headers={"X-Echo-Tenant": "acme", "x-echo-trace": "default", "x-other": "not forwarded"})
        options = defaults.merged(R(headers={"X-Echo-Trace": "call-1"}, parameters={"p": 1}))
        seen = _echo(module, client, options)
        assert seen["parameters"] == {"x-echo-tenant": "acme", "x-echo-trace": "call-1", "p": 1}
    finally:
        client.close()


@pytest.mark.parametrize("options, twice", [
    ({}, True), ({"idempotent": True}, True), ({"idempotent": False}, False),
    ({"sequence_id": 3}, False), ({"sequence_id": "s", "sequence_start": True}, False), ({"sequence_id": 0}, True),
])
def test_may_run_twice_says_whether_a_second_run_does_no_harm(options, twice):
    assert RequestOptions.of(**options).may_run_twice is twice
