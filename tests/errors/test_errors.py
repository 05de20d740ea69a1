"""tritonshm's errors are tritonclient's InferenceServerException too, and the server's errors
are translated by one table in errors.py (the lowest layer: it imports nothing of tritonshm)."""

from __future__ import annotations

import ast
import errno
import inspect
import pickle
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

import tritonshm
from tritonshm import errors

CLASSES = [getattr(errors, name) for name in errors.__all__
           if inspect.isclass(getattr(errors, name)) and issubclass(getattr(errors, name), errors.Error)]
PACKAGE = Path(errors.__file__).parent


def make(cls):
    """An instance of *cls* as the library raises it."""
    if issubclass(cls, OSError):
        return cls(errno.ENOENT, "attaching: no such segment")
    return cls(f"a {cls.__name__}")


def test_every_error_is_an_inference_server_exception_and_keeps_its_builtin_base():
    assert tritonshm.Error in CLASSES and tritonshm.ServerError in CLASSES and len(CLASSES) > 20
    for cls in CLASSES:
        assert issubclass(cls, InferenceServerException) and issubclass(cls, tritonshm.Error), cls
    assert issubclass(tritonshm.InvalidOption, ValueError)
    assert issubclass(tritonshm.InvalidOptionType, TypeError)
    assert issubclass(tritonshm.DTypeMismatch, TypeError)
    assert issubclass(tritonshm.SharedMemoryOSError, OSError)
    assert issubclass(tritonshm.PoolExhausted, TimeoutError)
    assert issubclass(tritonshm.ServerUnavailable, ConnectionError)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_error_raised_here_has_no_status_and_pickles_whole(cls):
    exc = make(cls)
    with pytest.raises(InferenceServerException) as caught:
        raise exc
    assert caught.value.status() is None and caught.value.debug_details() is None
    assert caught.value.message() == str(exc) and str(exc)  # no "[None] " in front
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.args == exc.args
    assert back.status() is None


def test_an_os_error_keeps_errno_filename_and_its_text():
    exc = errors.os_error(errno.ENOSPC, "creating", key="/tritonshm-1-ab")
    assert (exc.errno, exc.filename) == (errno.ENOSPC, "/tritonshm-1-ab")
    assert str(exc).startswith("[Errno 28] creating: ") and "--shm-size" in str(exc)
    assert exc.message() == str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.errno, back.filename, str(back)) == (exc.errno, exc.filename, str(exc))


def test_extra_fields_and_the_servers_status_survive_pickling():
    exc = tritonshm.OutputTooSmall("too small", "OUT", 64, status="400", debug_details="server detail")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.output, back.needed, back.status(), back.debug_details()) == ("OUT", 64, "400", "server detail")
    cuda = pickle.loads(pickle.dumps(tritonshm.CudaError("refused", 2, "cudaErrorMemoryAllocation")))
    assert (cuda.code, cuda.name, str(cuda)) == (2, "cudaErrorMemoryAllocation", "refused")


SAMPLES = [
    ("Client shared memory is disabled", None, tritonshm.SharedMemoryRefused, "--allow-client-shm=true"),
    ("Unable to open shared memory region: '/x'", None, tritonshm.SharedMemoryRefused, "--ipc=host"),
    ("shared memory region 'r' already in manager", None, tritonshm.RegistrationError, "pick another name"),
    ("Unable to find system shared memory region: 'r'", None, tritonshm.RegionNotRegistered, "register it again"),
    ("for output 'OUT' (8 bytes) should be at least 16 bytes", None, tritonshm.OutputTooSmall, "needs 16 bytes"),
    ("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED", tritonshm.ServerTimeout, "client_timeout"),
    ("Request timeout expired", "StatusCode.UNAVAILABLE", tritonshm.ServerTimeout, "queue"),
    ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", tritonshm.ServerUnavailable, "cannot reach"),
    ("Socket closed", None, tritonshm.ServerUnavailable, "cannot reach"),
    ("anything at all", "StatusCode.UNAVAILABLE", tritonshm.ServerUnavailable, "cannot reach"),
]


@pytest.mark.parametrize("message, status, cls, hint", SAMPLES)
def test_the_table_turns_a_servers_error_into_the_class_that_fits(message, status, cls, hint):
    raw = InferenceServerException(msg=message, status=status, debug_details="the server's details")
    exc = errors.translate_error(raw, "inferring")
    assert type(exc) is cls
    assert str(exc).startswith("inferring: ") and hint in str(exc) and f"Server said: {message}" in str(exc)
    assert (exc.status(), exc.debug_details()) == (status, "the server's details")


def test_what_the_table_does_not_know_is_a_plain_server_error_and_a_cuda_refusal_names_the_causes():
    plain = errors.translate_error(InferenceServerException("unknown model 'm'", "StatusCode.NOT_FOUND"), "asking")
    assert type(plain) is tritonshm.ServerError and str(plain) == "asking: unknown model 'm'"
    assert plain.status() == "StatusCode.NOT_FOUND"
    cuda = errors.translate_error(InferenceServerException("invalid args"), "registering", cuda=True)
    assert type(cuda) is tritonshm.SharedMemoryRefused and "--ipc=host" in str(cuda)
    refused = errors.translate_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "connecting")
    assert type(refused) is tritonshm.ServerUnavailable and refused.status() is None
    ours = tritonshm.PoolExhausted("no slot")
    assert errors.translate_error(tritonshm.ServerError("as is"), "x").message() == "as is"
    assert isinstance(ours, InferenceServerException)


def test_errors_is_the_lowest_layer_and_the_wire_no_longer_imports_triton():
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    relative = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == []
    wire = ast.parse((PACKAGE / "_http1.py").read_text())
    sources = {node.module for node in ast.walk(wire) if isinstance(node, ast.ImportFrom) and node.level}
    assert "triton" not in sources and "errors" in sources


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_a_closed_port_is_server_unavailable_on_every_client_naming_where_and_what_to_do(scheme):
    """No server there: sync and aio clients, gRPC and HTTP, all raise ServerUnavailable (aio over
    HTTP raised a plain ServerError from aiohttp's words), saying to start one."""
    import asyncio
    import socket

    import tritonshm.aio

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    url = f"{scheme}127.0.0.1:{port}"
    x = np.ones(2, np.float32)
    with pytest.raises(tritonshm.ServerUnavailable, match="tritonshm server"):
        with tritonshm.Client(url) as c:
            c.infer("identity_fp32", {"INPUT0": x})

    async def main():
        async with tritonshm.aio.Client(url) as c:
            await c.infer("identity_fp32", {"INPUT0": x})

    with pytest.raises(tritonshm.ServerUnavailable, match="tritonshm server") as caught:
        asyncio.run(main())
    if scheme == "http://":
        assert f"127.0.0.1:{port}" in str(caught.value)  # where it looked


def test_an_unreachable_server_is_named_by_the_address_the_client_used_when_its_error_does_not_say():
    """A refused HTTP connection says only "[Errno 111] Connection refused": the hint names where
    the client looked; a message that names its address keeps that one."""
    from tritonshm.errors import ServerUnavailable, translate_error

    refused = translate_error(ConnectionRefusedError(111, "Connection refused"), "reading metadata of model 'm'",
                              address="http://localhost:1")
    assert isinstance(refused, ServerUnavailable)
    assert "is a Triton server running at http://localhost:1?" in str(refused)
    named = translate_error(Exception("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "
                                      "Failed to connect to remote host: Connection refused"), "x", address="elsewhere:1")
    assert "running at 127.0.0.1:9?" in str(named)
