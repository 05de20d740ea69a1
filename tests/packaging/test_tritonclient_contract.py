"""The tritonclient private names tritonshm uses (python/tritonshm/_tritonclient_compat.py, the
only module that touches them) against the installed tritonclient: a release that renames or
reshapes one fails here, by name and with the version, instead of a request at run time."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
from importlib.metadata import version
from pathlib import Path

import grpc
import numpy as np
import pytest

import tritonshm
from tritonshm import _tritonclient_compat as compat

from support.insides import facade_slots

TRITONCLIENT = version("tritonclient")
PACKAGE = Path(tritonshm.__file__).parent      # the installed package (a wheel's, under cibuildwheel)
REPO = Path(__file__).resolve().parents[2]     # beside tests/: pyproject.toml, bench/ (if there)
TESTS = Path(__file__).resolve().parents[1]    # the test suite, tests/support/ included


class _Refused(grpc.RpcError):
    """A gRPC failure as grpcio raises one: the server is not there."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"

    def debug_error_string(self):
        return "debug"


def _resolve(private: compat.Private):
    target = importlib.import_module(private.module)
    for part in private.qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            pytest.fail(f"tritonclient {TRITONCLIENT} has no {private.module}.{private.qualname}: "
                        f"tritonshm._tritonclient_compat needs it (see its CONTRACT)")
    return target


@pytest.mark.parametrize("private", compat.CONTRACT, ids=lambda p: f"{p.module}.{p.qualname}")
def test_each_private_name_is_there_and_takes_our_arguments(private):
    signature = inspect.signature(_resolve(private))
    try:
        signature.bind(*[None] * private.positional, **{name: None for name in private.keywords})
    except TypeError as exc:
        pytest.fail(f"tritonclient {TRITONCLIENT}: {private.module}.{private.qualname}{signature} no longer "
                    f"takes what tritonshm._tritonclient_compat passes ({exc})")


def test_the_builders_and_the_grpc_parts_still_do_what_we_use_them_for():
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = np.arange(4, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(x)
    message = compat.grpc_request(model_name="m", inputs=[inp], model_version="2", request_id="r",
                                  outputs=None, sequence_id=7, sequence_start=True, sequence_end=False,
                                  priority=1, timeout=1000, parameters={"k": "v"})
    assert (message.model_name, message.model_version, message.id, message.inputs[0].name) == ("m", "2", "r", "INPUT0")
    assert message.parameters["sequence_id"].int64_param == 7 and message.parameters["timeout"].int64_param == 1000
    hinp = httpclient.InferInput("INPUT0", [4], "FP32")
    hinp.set_data_from_numpy(x, binary_data=True)
    body, json_size = compat.http_request(inputs=[hinp], request_id="", outputs=None, sequence_id=0,
                                          sequence_start=False, sequence_end=False, priority=0, timeout=None,
                                          custom_parameters=None)
    assert isinstance(body, bytes) and json_size is not None and body[json_size:] == x.tobytes()
    assert compat.grpc_compression("gzip") == grpc.Compression.Gzip
    assert compat.grpc_compression(None) in (None, grpc.Compression.NoCompression)

    error = compat.grpc_error(_Refused())
    assert (error.message(), error.status(), error.debug_details()) == ("connection refused",
                                                                       "StatusCode.UNAVAILABLE", "debug")
    with pytest.raises(type(error)):
        compat.raise_grpc_error(_Refused())
    assert compat.grpc_parts()[1] is grpcclient.InferResult


def test_a_grpc_clients_stub_and_metadata_blocking_and_aio():
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aiogrpc

    def check(client):
        stub = compat.grpc_stub(client)
        assert callable(getattr(stub, "ModelInfer", None)) and callable(getattr(stub, "ModelStreamInfer", None)), \
            f"tritonclient {TRITONCLIENT}: a gRPC client's _client_stub lacks ModelInfer / ModelStreamInfer"
        assert ("x-k", "v") in tuple(compat.grpc_metadata(client, {"x-k": "v"}) or ())

    def replaced(client, aio=False):
        """A test's in-process server answers in the stub's place (tests/support/fake_triton.py):
        tritonclient's own calls go to it."""
        from tritonclient.grpc import service_pb2

        def metadata(request, metadata=None, timeout=None):
            response = service_pb2.ModelMetadataResponse(name=request.name, versions=["1"])
            if not aio:
                return response

            async def answered():
                return response

            return answered()

        stub = type("Stub", (), {"ModelMetadata": staticmethod(metadata)})()
        assert compat.with_grpc_stub(client, stub) is client and compat.grpc_stub(client) is stub
        return client.get_model_metadata("m", as_json=True)

    client = grpcclient.InferenceServerClient("localhost:1")  # never connects
    check(client)
    assert replaced(client) == {"name": "m", "versions": ["1"]}
    client.close()

    async def aio():
        client = aiogrpc.InferenceServerClient("localhost:1")
        check(client)
        assert await replaced(client, aio=True) == {"name": "m", "versions": ["1"]}
        await client.close()

    asyncio.run(aio())


def test_no_other_module_touches_a_private_name_of_tritonclient():
    """Every import from a tritonclient module's private part, and every use of the names in
    CONTRACT or of _client_stub, is in the compatibility module: not elsewhere in the package,
    the benchmarks, or the tests (the fake Triton of tests/support included, which puts its
    stub in a client through the module too)."""
    names = {p.qualname.split(".")[-1] for p in compat.CONTRACT} | {"_client_stub"}
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "bench").glob("*.py"), *TESTS.rglob("*.py")]:
        if path.name == "_tritonclient_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritonclient") and (
                    any(part.startswith("_") for part in node.module.split("."))
                    or any(alias.name.startswith("_") for alias in node.names)):
                offenders.append(f"{path.name}:{node.lineno} imports from {node.module}")
            elif isinstance(node, ast.Attribute) and node.attr in names:
                offenders.append(f"{path.name}:{node.lineno} uses .{node.attr}")
    assert offenders == []


def test_pyproject_sets_no_upper_bound_on_tritonclient():
    """A cap would keep tritonshm from installing beside next month's tritonclient: a release
    that breaks a private name is met by the fallbacks below instead."""
    text = (REPO / "pyproject.toml").read_text()
    assert '"tritonclient[grpc,http]>=2.70",' in text
    major, minor = (int(part) for part in TRITONCLIENT.split(".")[:2])
    assert (major, minor) >= (2, 70), f"tritonclient {TRITONCLIENT} is below the bound"


# -- a release without a private name: one warning, the public path --------------------------


@pytest.fixture
def without(monkeypatch):
    """``without(module, qualname)``: the installed tritonclient as a release that dropped it."""
    compat.usable.cache_clear()
    compat.grpc_parts.cache_clear()

    def drop(module, qualname):
        owner = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        monkeypatch.delattr(owner, name)
        compat.usable.cache_clear()  # what was found before is found again
        compat.grpc_parts.cache_clear()

    yield drop
    compat.usable.cache_clear()
    compat.grpc_parts.cache_clear()


def test_a_dropped_error_translation_warns_once_and_translates_as_tritonclient(without):
    expected = compat.grpc_error(_Refused())
    without("tritonclient.grpc._utils", "get_error_grpc")
    without("tritonclient.grpc._utils", "raise_error_grpc")
    with pytest.warns(compat.TritonclientChanged, match="get_error_grpc") as caught:
        made = [compat.grpc_error(_Refused()) for _ in range(3)]
    assert len([w for w in caught if "get_error_grpc" in str(w.message)]) == 1
    for error in made:
        assert (error.message(), error.status(), error.debug_details()) == \
            (expected.message(), expected.status(), expected.debug_details())
    with pytest.warns(compat.TritonclientChanged, match="raise_error_grpc"):
        with pytest.raises(type(expected)) as raised:
            compat.raise_grpc_error(_Refused())
    assert raised.value.status() == "StatusCode.UNAVAILABLE"


def test_a_dropped_compression_helper_is_made_here(without):
    expected = {name: compat.grpc_compression(name) for name in ("gzip", "deflate")}
    without("tritonclient.grpc._utils", "_grpc_compression_type")
    with pytest.warns(compat.TritonclientChanged):
        assert {name: compat.grpc_compression(name) for name in ("gzip", "deflate")} == expected
    assert compat.grpc_compression(None) == grpc.Compression.NoCompression


def test_a_dropped_request_builder_says_what_to_install(without):
    without("tritonclient.grpc._utils", "_get_inference_request")
    with pytest.warns(compat.TritonclientChanged):
        with pytest.raises(compat.TritonclientIncompatible) as caught:
            compat.grpc_request(model_name="m", inputs=[])
    assert "pip install 'tritonclient[grpc,http]<=" in caught.value.message()
    assert TRITONCLIENT in caught.value.message()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_request_objects_we_cannot_read_make_the_facade_tritonclients_own(without, protocol):
    """The facade's InferInput keeps no array, and its calls are tritonclient's own (checked
    without a server: the call is planned, and not taken, before any connection)."""
    facade = importlib.import_module(f"tritonshm.{protocol}")
    without(f"tritonclient.{protocol}", "InferInput._get_tensor")
    x = np.arange(4, dtype=np.float32)
    with pytest.warns(compat.TritonclientChanged, match="_get_tensor"):
        inp = facade.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(x)
    assert inp.kept_array() is None  # tritonclient's own bytes
    client = facade.InferenceServerClient("localhost:1")
    try:
        route = facade_slots(client)
        assert route.infer(client, "identity_fp32", [inp], "", None, "", {}) is None
        assert route.client is None  # no slots were made for it
    finally:
        client.close()
