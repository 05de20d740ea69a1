"""GPU tensors through the high-level client on a real GPU: torch, cupy, a real Triton.

Run on a CUDA machine with ``pytest -m gpu`` (tests/gpu/run.sh on the
offline GPU machine).  Everything skips where no GPU is usable; the same
logic runs on every machine against the fake runtime in test_client_cuda.py.
"""

from __future__ import annotations

import concurrent.futures
import gc
import warnings

import numpy as np
import pytest

import tritonshm
from tritonshm import cuda
from tritonshm._memory import _runtime

from triton_fixtures import NUMERIC_IDENTITY_MODELS, client_url, sample, start_or_skip

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]


def _on_gpu(torch, data: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(data)).to("cuda:0")


@pytest.mark.parametrize("model, dtype", sorted(NUMERIC_IDENTITY_MODELS.items()))
def test_torch_round_trip_for_every_dtype(server, protocol, torch, model, dtype):
    data = sample(dtype, 4099)
    with tritonshm.Client(client_url(server, protocol)) as c:
        out = c.infer(model, {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
        assert isinstance(out, torch.Tensor) and out.is_cuda
        np.testing.assert_array_equal(out.cpu().numpy(), data)
        assert [(p.model, p.memory) for p in c.pools()] == [(model, "cuda:0")]


def test_cupy_round_trip_and_copy_false_views(server, cupy):
    data = sample(np.float32, 1 << 16)
    with tritonshm.Client(server.grpc_url) as c:
        out = c.infer("identity_fp32", {"INPUT0": cupy.asarray(data)})["OUTPUT0"]
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(out), data)
        view = c.infer("identity_fp32", {"INPUT0": cupy.asarray(data)}, copy=False)["OUTPUT0"]
        assert isinstance(view, cuda.CudaArray)
        np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(view)), data)


def test_results_held_by_torch_stay_intact_across_later_requests(server, torch):
    with tritonshm.Client(server.grpc_url, slots=2) as c:
        kept = []
        for i in range(10):
            data = sample(np.float32, 1 << 14, seed=i)
            view = c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)}, copy=False)["OUTPUT0"]
            kept.append((data, torch.from_dlpack(view)))  # only the DLPack tensor holds the slot
            del view
        gc.collect()
        for data, tensor in kept:
            np.testing.assert_array_equal(tensor.cpu().numpy(), data)
        assert c.pools()[0].held == 10
        del kept, tensor
        gc.collect()
        assert c.pools()[0].held == 0


def test_chunked_torch_batch(server, torch):
    with tritonshm.Client(server.grpc_url) as c:
        limit = c.model_info("batched_fp32").max_batch_size
        data = sample(np.float32, (limit * 3 + 1) * 4).reshape(limit * 3 + 1, 4)
        out = c.infer("batched_fp32", {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == data.shape
        np.testing.assert_array_equal(out.cpu().numpy(), data * 2)


def test_eight_threads_times_200_requests_verified(server, torch):
    with tritonshm.Client(server.grpc_url, slots=4) as c:
        def work(seed):
            for i in range(200):
                data = torch.full((1024,), float(seed * 1000 + i), device="cuda:0")
                out = c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"]
                assert bool((out == seed * 1000 + i).all()), (seed, i)

        with concurrent.futures.ThreadPoolExecutor(8) as threads:
            list(threads.map(work, range(8)))  # re-raises the first failure


def test_zero_copy_device_request_filled_by_torch(server, torch):
    with tritonshm.Client(server.grpc_url) as c:
        with c.request("batched_fp32", batch_size=8, device="cuda:0") as req:
            torch.from_dlpack(req.inputs["INPUT0"]).copy_(torch.arange(32.0, device="cuda:0").reshape(8, 4))
            out = torch.from_dlpack(req.run()["OUTPUT0"])
            assert bool((out == torch.arange(32.0, device="cuda:0").reshape(8, 4) * 2).all())


def test_host_inputs_with_results_on_the_gpu(server, torch):
    data = sample(np.float32, 1000)
    with tritonshm.Client(server.grpc_url, pinned=True) as c:
        out = c.infer("identity_fp32", {"INPUT0": data}, output_device="cuda")["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray)
        np.testing.assert_array_equal(out.get(), data)


def test_falls_back_to_pinned_slots_when_the_server_cannot_open_our_handles(torch):
    from tritonshm.server import LocalServer

    data = sample(np.float32, 4096)
    # A server that sees no GPU: it cannot open our CUDA handles.
    with start_or_skip(LocalServer(env={"CUDA_VISIBLE_DEVICES": ""})) as srv:
        with tritonshm.Client(srv.grpc_url) as c:
            with pytest.warns(RuntimeWarning, match="pinned system shared memory"):
                out = c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
            assert isinstance(out, torch.Tensor) and out.is_cuda
            np.testing.assert_array_equal(out.cpu().numpy(), data)
            assert [p.memory for p in c.pools()] == ["pinned:0"]
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})
        with tritonshm.Client(srv.grpc_url, transport="cuda") as c:
            with pytest.raises(tritonshm.SharedMemoryRefused):
                c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})


def test_thousand_requests_leak_nothing(server, torch):
    data = _on_gpu(torch, sample(np.float32, 1 << 16))
    with tritonshm.Client(server.grpc_url) as c:
        for _ in range(20):  # the pool and torch's caches settle
            c.infer("identity_fp32", {"INPUT0": data})
        torch.cuda.synchronize()
        free_before = _runtime.current().mem_info(0)[0]
        for _ in range(1000):
            out = c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"]
        assert bool((out == data).all())
        del out
        gc.collect()
        torch.cuda.synchronize()
        # torch caches what it frees; our own allocations are one pool and no more
        assert _runtime.current().mem_info(0)[0] >= free_before - (8 << 20)
        names = {name for pool in c.pools() for name in pool.regions}
        assert len(names) == 1
        assert names <= set(tritonshm.status(c.tritonclient, kind="cuda"))
    with tritonshm.Client(server.grpc_url) as probe:
        assert not names & set(tritonshm.status(probe.tritonclient, kind="cuda"))
