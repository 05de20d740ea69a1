"""Copied GPU results without a CPU wait (issue 40), on the FAKE runtime against a real Triton.

A lent input's results are copied out of the CUDA slot into tritonshm's own ``CudaArray``\\ s on the
copy stream, and handed out before the copy has landed (the fake lands queued work only when
something synchronizes it).  Every reader must order after the copy, the slot must not be leased
again (and written by the server) before the copy out of it has read it, and a result block must not
be handed out again under a copy into it.  (Our results are the slot itself where the pool has one
to spare -- test_client_results_in_place.py; here they are copied, as torch's and cupy's are.)"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tritonshm
from tritonshm.client._plan import Plan

from triton_fixtures import client_url

pytestmark = pytest.mark.server

N = 4096
MODEL = "identity_fp32"


@pytest.fixture
def url(fake_cuda_server, fake_cuda):
    return client_url(fake_cuda_server, "grpc")


@pytest.fixture(autouse=True)
def results_copied(monkeypatch):
    """Results copied out of the slot, as torch's and cupy's are (and ours when the pool has no
    slot to spare): none written in place."""
    monkeypatch.setattr(Plan, "results_in_place", property(lambda plan: False))


def test_a_result_read_at_once_sees_the_copy(url, fake_cuda, torch_like):
    """A CudaArray result is handed out before the copy into it landed (no CPU wait for it); its
    .get() orders after that copy."""
    data = np.arange(N, dtype=np.float32)
    x = torch_like.from_numpy(data)
    with tritonshm.Client(url) as c:
        for _ in range(3):
            out = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
            assert isinstance(out, tritonshm.CudaArray)
            assert out.pending  # handed out before the copy landed: no CPU wait for it
            np.testing.assert_array_equal(out.get(), data)
            assert not out.pending


def test_back_to_back_requests_do_not_reuse_a_slot_under_its_copy(url, fake_cuda, torch_like):
    """One slot: the second request's server write would land in the slot the first result is still
    being copied out of (the second ordered on another stream: nothing but the slot's hold orders it
    after that copy)."""
    first, second = np.full(N, 1.0, np.float32), np.full(N, 2.0, np.float32)
    x1, x2 = torch_like.from_numpy(first), torch_like.from_numpy(second)
    with tritonshm.Client(url, slots=1) as c:
        c.infer(MODEL, {"INPUT0": x1})  # the pool is made
        a = c.infer(MODEL, {"INPUT0": x1})["OUTPUT0"]
        with torch_like.stream():  # (the second's ordering point is not after the first's copy)
            b = c.infer(MODEL, {"INPUT0": x2})["OUTPUT0"]
        np.testing.assert_array_equal(b.get(), second)
        np.testing.assert_array_equal(a.get(), first)


def test_a_result_dropped_before_its_copy_landed(url, fake_cuda, torch_like):
    """The dropped result's block is not handed out for the next result while the copy into it is
    queued (another thread's copy stream could land first), and nothing is lost."""
    data = [np.full(N, float(i), np.float32) for i in range(4)]
    inputs = [torch_like.from_numpy(d) for d in data]
    with tritonshm.Client(url) as c:
        for x, d in zip(inputs, data):
            out = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
            del out
            gc.collect()
        kept = c.infer_async(MODEL, {"INPUT0": inputs[1]}).result()["OUTPUT0"]
        np.testing.assert_array_equal(kept.get(), data[1])
        cai = c.infer(MODEL, {"INPUT0": inputs[2]})["OUTPUT0"]
        assert cai.__cuda_array_interface__["stream"] is None and not cai.pending  # waited on the CPU
        host = np.empty(N, np.float32)
        tritonshm.cuda.copy(host, cai)
        np.testing.assert_array_equal(host, data[2])


def result_still_copied(c, fake_cuda, torch_like, data):
    """A result of *data* from *c* whose copy out of the slot is still queued, in a block that held
    zeros before (so a reader not ordered after the copy sees zeros), and its input (kept by the
    caller: freeing it would land every queued copy)."""
    x = torch_like.zeros(N)
    c.infer(MODEL, {"INPUT0": x}).clear()  # the pool is made, x lent; the result block holds zeros
    x.copy_(data)
    out = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
    assert out.pending and fake_cuda.pending(), "the copy is still queued"
    return out, x


def test_a_result_consumed_through_dlpack_on_another_stream_is_read_after_the_copy(url, fake_cuda, torch_like):
    """The caller's stream was ordered after the copy; a consumer that takes the result on a stream
    of its own (``__dlpack__(stream=s)``) has that stream ordered after it too."""
    data = np.arange(N, dtype=np.float32)
    with tritonshm.Client(url) as c:
        out, x = result_still_copied(c, fake_cuda, torch_like, data)
        assert fake_cuda.pending(), "the copy is still queued"
        with torch_like.stream():
            y = torch_like.from_dlpack(out)
            np.testing.assert_array_equal(y.numpy(), data)  # (read on the consumer's stream)
        del y, out


def test_a_result_sent_again_from_another_stream_is_sent_after_the_copy(url, fake_cuda, torch_like):
    """A result given back as the next request's input, on a stream the copy was not ordered
    before: the server reads it only once the copy into it has landed."""
    data = np.arange(N, dtype=np.float32)
    with tritonshm.Client(url) as c:
        out, x = result_still_copied(c, fake_cuda, torch_like, data)
        assert fake_cuda.pending(), "the copy is still queued"
        with torch_like.stream():
            again = c.infer(MODEL, {"INPUT0": out})["OUTPUT0"]
            np.testing.assert_array_equal(again.get(), data)
        del out, again


def test_a_dropped_results_block_is_not_reused_under_the_copy_into_it(url, fake_cuda, torch_like):
    """A result dropped while the copy into it is queued on this thread's copy stream: its block
    does not hold a result a worker thread copies on its own stream meanwhile (the first copy would
    land after the second and overwrite it)."""
    first, second = np.full(N, 1.0, np.float32), np.full(N, 2.0, np.float32)
    x1, x2 = torch_like.from_numpy(first), torch_like.from_numpy(second)
    with tritonshm.Client(url) as c:
        c.infer(MODEL, {"INPUT0": x1}).clear()  # the pool is made, the result block cached
        dropped = c.infer(MODEL, {"INPUT0": x1})["OUTPUT0"]
        assert dropped.pending
        del dropped
        gc.collect()
        with torch_like.stream():  # (the worker's request is not ordered after the first copy)
            kept = c.infer_async(MODEL, {"INPUT0": x2}).result()["OUTPUT0"]
        kept.synchronize()  # the worker's copy lands (the first one need not)
        fake_cuda.device_synchronize()  # everything else queued lands: the first copy too
        np.testing.assert_array_equal(kept.get(), second)


def test_copy_false_results_copied_to_a_gpu_keep_their_host_slot_until_copied(url, fake_cuda):
    """copy=False with host inputs and results wanted on a GPU: the results are copies out of a
    pinned host slot (read when the copy lands) leased with a handle -- it comes back when the
    handle goes, not with the request's claim -- so the copy out of it is waited for before the
    slot can go to the next request."""
    first, second = np.full(N, 1.0, np.float32), np.full(N, 2.0, np.float32)
    with tritonshm.Client(url, slots=1, pinned=True) as c:
        c.infer(MODEL, {"INPUT0": first}, copy=False, output_device="cuda")  # the pool is made
        a = c.infer(MODEL, {"INPUT0": first}, copy=False, output_device="cuda")["OUTPUT0"]
        b = c.infer(MODEL, {"INPUT0": second}, copy=False, output_device="cuda")["OUTPUT0"]
        np.testing.assert_array_equal(b.get(), second)
        np.testing.assert_array_equal(a.get(), first)
