"""tritonshm.grpc / tritonshm.http against tritonclient where they differed last (issue 39): a client
dropped with requests pending, a stream after "unregister everything", ``verbose=True``, and the
text of an error.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server (or a server of its own) and compares what the caller sees; the facade's calls are
checked to have gone through its slots.
"""

from __future__ import annotations

import gc
import importlib
import threading

import numpy as np
import pytest

from tritonshm.errors import InferenceServerException

pytestmark = pytest.mark.server


def modules(protocol):
    """(tritonclient's module, the facade's) for *protocol*."""
    return importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")


def connect(module, server, protocol, **kwargs):
    """A client of *module*; a facade's sends even its smallest calls through the slots."""
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url, **kwargs)
    if module.__name__.startswith("tritonshm"):
        client.tritonshm_inline_bytes = 0
    return client


def inputs_of(module, array, name="INPUT0", datatype="FP32"):
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return [inp]


# -- 1. a client dropped with async_infer calls pending -------------------------------------------


def dropped_with_pending(module, server, protocol, count):
    """async_infer *count* requests to slow_fp32 (500 ms each), drop the client at once, then
    wait for what they answer: results or errors, in order."""
    client = connect(module, server, protocol)
    arrays = [np.full(4, i, np.float32) for i in range(count)]
    if protocol == "grpc":
        answers, left = [None] * count, threading.Semaphore(0)

        def callback(index, result, error):
            answers[index] = error if error is not None else result.as_numpy("OUTPUT0")
            left.release()

        for i, x in enumerate(arrays):
            client.async_infer("slow_fp32", inputs_of(module, x),
                               lambda result, error, i=i: callback(i, result, error))
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        del client
        gc.collect()
        for _ in arrays:
            assert left.acquire(timeout=30), "a callback was never called"
    else:
        pending = [client.async_infer("slow_fp32", inputs_of(module, x)) for x in arrays]
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        del client
        gc.collect()
        answers = []
        for request in pending:
            try:
                answers.append(request.get_result(timeout=30).as_numpy("OUTPUT0"))
            except InferenceServerException as error:
                answers.append(error)
    return answers, slots, held


def test_a_dropped_client_finishes_its_pending_async_infer_as_tritonclients(server, protocol):
    plain_module, facade_module = modules(protocol)
    expected, _, _ = dropped_with_pending(plain_module, server, protocol, 3)
    got, slots, held = dropped_with_pending(facade_module, server, protocol, 3)
    assert [a.tolist() for a in expected] == [[float(i)] * 4 for i in range(3)]
    assert [a if isinstance(a, Exception) else a.tolist() for a in got] == [a.tolist() for a in expected]
    assert held is not None and held.pools(), "the facade sent its tensors over the wire"
    # Once they are done, the dropped client goes, and its slots with it.
    del got
    for _ in range(100):
        gc.collect()
        if slots.client is None:
            break
        threading.Event().wait(0.05)
    assert slots.client is None, "the dropped client's slots were never released"
