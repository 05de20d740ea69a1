"""Server URLs: parsed in one place (_transport.parse_url), tritonclient's and PyTriton's default
ports when none is given, and a tritonshm error naming the forms for anything else."""

from __future__ import annotations

import pytest

import tritonshm
from tritonshm import _transport


@pytest.mark.parametrize("url, protocol, address, ssl", [
    ("localhost", "grpc", "localhost:8001", False),
    ("localhost:9001", "grpc", "localhost:9001", False),
    ("grpc://localhost", "grpc", "localhost:8001", False),
    ("grpcs://triton.example", "grpc", "triton.example:8001", True),
    ("http://localhost", "http", "localhost:8000", False),
    ("http://localhost/", "http", "localhost:8000", False),
    ("HTTP://10.0.0.7:18000", "http", "10.0.0.7:18000", False),
    ("https://gateway.example", "http", "gateway.example:443", True),
    ("http://[::1]", "http", "[::1]:8000", False),
    ("[fe80::1%eth0]:8001", "grpc", "[fe80::1%eth0]:8001", False),
])
def test_a_url_without_a_port_gets_the_schemes_default(url, protocol, address, ssl):
    for aio in (False, True):
        transport, got, secure = _transport.parse_url(url, aio=aio)
        assert (transport.protocol, transport.aio, got, secure) == (protocol, aio, address, ssl)


@pytest.mark.parametrize("url, why", [
    ("localhost:abc", "cannot read a host and port"),
    ("localhost:", "cannot read a host and port"),
    ("::1", "cannot read a host and port"),          # IPv6 needs its brackets
    ("http://", "cannot read a host and port"),
    ("http://host:8000/v2", "cannot read a host and port"),
    ("http://user@host", "cannot read a host and port"),
    ("two words", "cannot read a host and port"),
    ("ftp://host", "unknown scheme 'ftp'"),
    ("http://host:0", "port 0 .* is not in 1-65535"),
    ("grpc://host:65536", "port 65536 .* is not in 1-65535"),
    ("  ", "must not be empty"),
])
def test_anything_else_is_a_tritonshm_value_error_naming_the_forms(url, why):
    with pytest.raises(tritonshm.InvalidOption, match=why) as caught:
        tritonshm.Client(url)
    assert isinstance(caught.value, ValueError)
    if "port" not in why:
        assert "'http://host[:port]'" in str(caught.value) and "8000 for http://" in str(caught.value)


def test_a_url_that_is_not_a_str_is_a_type_error():
    with pytest.raises(tritonshm.InvalidOptionType, match="must be a str, not int"):
        tritonshm.Client(8001)


def test_the_http_wire_gets_the_default_port_through_the_transport():
    """_http1.Endpoint.parse reads the "host:port" parse_url made; it never parses a URL itself."""
    from tritonshm import _http1

    _, address, _ = _transport.parse_url("http://localhost")
    assert _http1.Endpoint.parse(address)[:2] == ("localhost", 8000)
    _, address, _ = _transport.parse_url("http://[::1]")
    assert _http1.Endpoint.parse(address)[:2] == ("::1", 8000)
