"""The bundled sequence model ``accumulate_fp32`` (sequence batcher, "oldest" strategy), driven
through plain tritonclient with sequence_id / sequence_start / sequence_end, both protocols."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import tritonshm
from triton_fixtures import make_client

MODEL = "accumulate_fp32"


def step(module, client, x, sequence_id, start=False, end=False, **kwargs):
    """One request of a sequence: OUTPUT0 as a flat list."""
    x = np.asarray(x, np.float32).reshape(1, -1)
    i0 = module.InferInput("INPUT0", list(x.shape), "FP32")
    i0.set_data_from_numpy(x)
    result = client.infer(MODEL, [i0], sequence_id=sequence_id, sequence_start=start, sequence_end=end, **kwargs)
    out = result.as_numpy("OUTPUT0")
    assert out.shape == x.shape and out.dtype == np.float32
    return out.reshape(-1).tolist()


def test_config(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config(MODEL).config
        assert config.max_batch_size == 8 and config.sequence_batching.HasField("oldest")
        assert sorted(c.name for c in config.sequence_batching.control_input) == ["END", "READY", "START"]
        assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [-1])]
    finally:
        client.close()


@pytest.mark.parametrize("ids", [(101, 102), ("chat-a", "chat-b"), (103, "103")], ids=["int", "str", "mixed"])
def test_running_sums_of_interleaved_sequences(triton_client, ids):
    module, client = triton_client
    a, b = ids
    assert step(module, client, [1, 2], a, start=True) == [1, 2]
    assert step(module, client, [10, 20], b, start=True) == [10, 20]  # int 103 and str "103" are two sequences
    assert step(module, client, [1, 2], a) == [2, 4]
    assert step(module, client, [5, 5], b, end=True) == [15, 25]
    assert step(module, client, [0.5, 0.5], a, end=True) == [2.5, 4.5]


def test_start_resets_and_end_drops_the_sum(triton_client):
    module, client = triton_client
    assert step(module, client, [1], 201, start=True) == [1]
    assert step(module, client, [1], 201) == [2]
    assert step(module, client, [7], 201, start=True) == [7]  # a new sequence under the same id
    assert step(module, client, [1], 201, end=True) == [8]
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first request"):
        step(module, client, [1], 201)
    assert step(module, client, [3], 201, start=True, end=True) == [3]  # a one-request sequence


def test_what_the_server_refuses(triton_client):
    module, client = triton_client
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        step(module, client, [1], 0)
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        step(module, client, [1], "")
    x = np.ones((2, 1), np.float32)  # two rows: a sequence takes one per request
    i0 = module.InferInput("INPUT0", [2, 1], "FP32")
    i0.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence"):
        client.infer(MODEL, [i0], sequence_id=301, sequence_start=True)


def test_a_sequence_keeps_its_length(triton_client):
    module, client = triton_client
    assert step(module, client, [1, 1], 302, start=True) == [1, 1]
    with pytest.raises(InferenceServerException, match=r"sequence 302: INPUT0 shape \[1, 3\] is not its first"):
        step(module, client, [1, 1, 1], 302, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(module, client, [1, 1], 302)  # the END of the refused request ended the sequence


def test_largest_int_id_on_both_protocols(triton_client):
    module, client = triton_client
    assert step(module, client, [4], (1 << 63) - 1, start=True, end=True) == [4]


def test_sixteen_sequences_at_once(server):
    """Concurrent sequences (one thread each) all keep their own sums: the oldest strategy has
    16 candidate slots on the one instance."""
    errors, sums = queue.Queue(), {}

    def run(k):
        module, client = make_client(server, "grpc")
        try:
            total = 0.0
            for i in range(5):
                total += k + i
                out = step(module, client, [k + i], f"par-{k}", start=i == 0, end=i == 4)
                assert out == [total], (k, i, out)
            sums[k] = total
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            errors.put(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors.empty(), errors.get()
    assert sums == {k: float(5 * k + 10) for k in range(16)}


def test_a_sequence_over_a_grpc_stream(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses = queue.Queue()
    client.start_stream(lambda result, error: responses.put((result, error)))
    try:
        for i, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
            i0 = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
            i0.set_data_from_numpy(np.full((1, 2), i + 1, np.float32))
            client.async_stream_infer(MODEL, [i0], request_id=f"s{i}", sequence_id="streamed",
                                      sequence_start=start, sequence_end=end)
        got = [responses.get(timeout=10) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    assert [e for _, e in got] == [None] * 3
    assert [(r.get_response().id, r.as_numpy("OUTPUT0").tolist()) for r, _ in got] == \
        [("s0", [[1, 1]]), ("s1", [[3, 3]]), ("s2", [[6, 6]])]


def test_a_sequence_through_system_shared_memory(triton_client):
    module, client = triton_client
    with tritonshm.SystemRegion.create(4096) as region:
        name = tritonshm.register(client, region)
        try:
            total = np.zeros((1, 3), np.float32)
            for i in range(3):
                x = np.arange(3, dtype=np.float32).reshape(1, 3) * (i + 1)
                total += x
                region.write(x)
                i0 = module.InferInput("INPUT0", [1, 3], "FP32")
                tritonshm.bind_input(i0, region, 0, 12)
                o0 = module.InferRequestedOutput("OUTPUT0")
                tritonshm.bind_output(o0, region, 1024, 12)
                result = client.infer(MODEL, [i0], outputs=[o0], sequence_id=401 if module is grpcclient else 402,
                                      sequence_start=i == 0, sequence_end=i == 2)
                np.testing.assert_array_equal(region.read(np.float32, (1, 3), offset=1024), total)
        finally:
            tritonshm.unregister(client, name)
