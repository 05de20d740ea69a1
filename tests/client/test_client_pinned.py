"""Client(pinned=True): page-locked host slot pools, on the FAKE CUDA runtime and a real server."""

from __future__ import annotations

import numpy as np
import pytest

import tritonshm
from tritonshm.client._slots import SYSTEM, SlotKind  # noqa: F401 (the private pool keys)
from triton_fixtures import client_url
from support.insides import live_pool


def test_pinned_pools_are_page_locked_and_released(fake_cuda, server, protocol):
    registered_before = fake_cuda.stats().live
    with tritonshm.Client(client_url(server, protocol), pinned=True) as c:
        data = np.arange(1000, dtype=np.float32)
        assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)
        (extent,) = live_pool(c, "identity_fp32").extents
        assert extent.memory.region.pinned and extent.memory.kind == "system"
        assert fake_cuda.stats().live != registered_before  # one host registration more
        kept = [c.infer("identity_fp32", {"INPUT0": data + i}, copy=False)["OUTPUT0"] for i in range(6)]
        assert all(r.memory.region.pinned for r in live_pool(c, "identity_fp32").extents)
        for i, view in enumerate(kept):
            assert np.array_equal(view, data + i)
        del kept, view
    # the fake_cuda fixture fails the test if a host registration outlives the client


def test_pinned_needs_cuda(server):
    from tritonshm import cuda

    if cuda.available():
        pytest.skip("a usable CUDA runtime and GPU are present: pinned=True works here")
    with pytest.raises(tritonshm.CudaUnavailable, match=r"pinned=True \(page-locking slots\) needs CUDA"):
        tritonshm.Client(server.grpc_url, pinned=True)


@pytest.mark.parametrize("bad", [-1, "cuda", 1.5])
def test_pinned_refuses_nonsense(server, bad):
    with pytest.raises(tritonshm.InvalidOption, match="pinned"):
        tritonshm.Client(server.grpc_url, pinned=bad)
