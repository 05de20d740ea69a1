"""The bundled ``echo_request`` model: what it reports of a request, through plain tritonclient.

(How each request option reaches it through RequestOptions is in tests/client/test_options.py.)
"""

from __future__ import annotations

import json
import time

import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "echo_request"


def echo(module, client, x, **kwargs):
    i0 = module.InferInput("INPUT0", list(x.shape), "FP32")
    i0.set_data_from_numpy(x)
    outputs = kwargs.pop("outputs", None)
    result = client.infer(MODEL, [i0], outputs=outputs, **kwargs)
    return result


def test_config(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config(MODEL).config
        assert config.max_batch_size == 8
        assert config.dynamic_batching.priority_levels == 2 and config.dynamic_batching.default_priority_level == 2
        policy = config.dynamic_batching.default_queue_policy
        assert policy.allow_timeout_override and policy.default_timeout_microseconds == 60_000_000
        assert [(o.name, o.data_type) for o in config.output] == [("OUTPUT0", 13), ("OUTPUT1", 11)]  # STRING, FP32
    finally:
        client.close()


def test_reports_the_request(triton_client):
    module, client = triton_client
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = echo(module, client, x, request_id="req-9", parameters={"a": "b", "n": 2, "x": 0.5, "t": False},
                  sequence_id="s", sequence_start=True, timeout=5_000_000)
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (2, 1) and out[0, 0] == out[1, 0]  # one row per request row, all the same
    seen = json.loads(out[0, 0])
    assert seen.pop("order") >= 0
    assert seen == {"parameters": {"a": "b", "n": 2, "x": 0.5, "t": False}, "request_id": "req-9",
                    "correlation_id": "s", "flags": 1, "timeout": 5_000_000,
                    "requested_output_names": ["OUTPUT0", "OUTPUT1"]}
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x)


def test_requested_outputs_and_order(triton_client):
    module, client = triton_client
    x = np.ones((1, 2), np.float32)
    only = [module.InferRequestedOutput("OUTPUT0")]
    first = json.loads(echo(module, client, x, outputs=only).as_numpy("OUTPUT0")[0, 0])
    second = json.loads(echo(module, client, x, outputs=only).as_numpy("OUTPUT0")[0, 0])
    assert first["requested_output_names"] == ["OUTPUT0"]
    assert second["order"] > first["order"]


def test_delay_ms_holds_the_request(triton_client):
    module, client = triton_client
    t0 = time.monotonic()
    seen = json.loads(echo(module, client, np.ones((1, 1), np.float32),
                           parameters={"delay_ms": 300}).as_numpy("OUTPUT0")[0, 0])
    assert time.monotonic() - t0 >= 0.29 and seen["parameters"] == {"delay_ms": 300}
