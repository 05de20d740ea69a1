"""CudaArray results written in place (issue 40), on the FAKE runtime against a real Triton.

A request whose results are tritonshm's own ``CudaArray``\\ s, on the GPU of its CUDA slot, gets as
each result a view of the slot the server wrote it in: nothing is copied after the answer, no
event is recorded for it.  It is still a copy to the caller: the result holds its slot until it is
gone (a later request never writes it), and a pool never gives its last free slot to a result --
those beyond are copied out as before, so keeping results never makes a request wait or fail.  A
request given up on keeps its slot for the server like any other.
"""

from __future__ import annotations

import concurrent.futures
import gc
import time

import numpy as np
import pytest

import tritonshm
from tritonshm.client._devices import as_device_tensor
from tritonshm.client._slots import SlotKind

from support.insides import live_pool
from triton_fixtures import client_url

pytestmark = pytest.mark.server

N = 4096
MODEL = "identity_fp32"


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    before = fake_cuda.stats()
    yield client_url(fake_cuda_server, protocol)
    # The server (another process) had our memory open: never freed under it, in any test here.
    assert (fake_cuda.stats() - before).freed_while_open == 0


def in_a_slot(client, result) -> bool:
    """Whether *result* is memory of one of *client*'s CUDA slots (written there by the server)."""
    return client._engine.pool_table.own_slot(as_device_tensor(result)) is not None


def test_a_result_is_the_slot_the_server_wrote_and_later_requests_leave_it_be(url, fake_cuda, torch_like):
    first, second = np.full(N, 1.0, np.float32), np.full(N, 2.0, np.float32)
    x1, x2 = torch_like.from_numpy(first), torch_like.from_numpy(second)
    with tritonshm.Client(url) as c:
        c.infer(MODEL, {"INPUT0": x1})  # the pool is made
        before = fake_cuda.stats()
        a = c.infer(MODEL, {"INPUT0": x1})["OUTPUT0"]
        assert isinstance(a, tritonshm.CudaArray) and in_a_slot(c, a)
        assert not a.pending  # nothing queued after the answer: the server wrote it
        assert (fake_cuda.stats() - before).async_copies == 0
        for _ in range(5):  # later requests take other slots while a holds its own
            b = c.infer(MODEL, {"INPUT0": x2})["OUTPUT0"]
            np.testing.assert_array_equal(b.get(), second)
        np.testing.assert_array_equal(a.get(), first)
        del a, b


def test_kept_results_never_take_the_last_free_slot(url, fake_cuda, torch_like):
    """Twelve results kept from a pool of four slots: three are slots, the rest copies; the pool
    neither grows nor waits, and each result is its own request's."""
    data = [np.full(N, float(i), np.float32) for i in range(12)]
    x = torch_like.zeros(N)  # (one input, lent: a fresh one per request would be copied into the slot)
    with tritonshm.Client(url, slots=4) as c:
        c.infer(MODEL, {"INPUT0": x})  # the pool is made
        gc.collect()
        pool = live_pool(c, MODEL, SlotKind.cuda(0))
        kept = []
        for d in data:
            x.copy_(d)  # (queued on the caller's stream: the request's ordering point is after it)
            kept.append(c.infer(MODEL, {"INPUT0": x}, slot_timeout=0.01)["OUTPUT0"])
        assert [in_a_slot(c, r) for r in kept] == [True] * 3 + [False] * 9
        assert len(pool.extents) == 1  # (never grown: a slot was free for each copied result)
        for result, d in zip(kept, data):
            np.testing.assert_array_equal(result.get(), d)
        del kept, result
        gc.collect()
        assert all(p.held == 0 for p in c.pools())  # each slot back once its result is gone
        again = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
        assert in_a_slot(c, again)
        np.testing.assert_array_equal(again.get(), data[-1])
        del again
        assert c.stats().copied == {}  # (every request lent its input)


@pytest.mark.parametrize("protocol", ["grpc"])  # (client_timeout is gRPC's)
def test_a_result_in_place_given_up_on_keeps_its_slot_for_the_server(url, fake_cuda, torch_like):
    """slow_fp32 answers after 500 ms; the client gives up at 0.1 s: the slot the server still writes
    is held for it, never the slot of a later result (which the late write would overwrite)."""
    x = torch_like.from_numpy(np.full(N, 7.0, np.float32))
    y = torch_like.from_numpy(np.full(N, 9.0, np.float32))
    with tritonshm.Client(url, slots=4) as c:
        c.infer("slow_fp32", {"INPUT0": y})  # the pool is made
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, client_timeout=0.1)
        pool = live_pool(c, "slow_fp32", SlotKind.cuda(0))
        for_server = {(extent.name, index) for extent in pool.extents for index in extent.for_server}
        assert c.stats().abandoned == 1 and len(for_server) == 1
        kept = [c.infer("slow_fp32", {"INPUT0": y})["OUTPUT0"] for _ in range(2)]
        slots = [c._engine.pool_table.own_slot(as_device_tensor(result)) for result in kept]
        slots = [lent for lent in slots if lent is not None]
        assert slots  # (in place: the extent of the server's slot is out of leasing, another has slots)
        assert not {(lent.name, lent.offset // pool.layout.slot_bytes) for lent in slots} & for_server
        time.sleep(0.6)  # the abandoned request has written its output by now
        for result in kept:
            np.testing.assert_array_equal(result.get(), np.full(N, 9.0, np.float32))
        del kept, result, slots


def test_a_result_given_as_out_is_written_in_its_slot_and_never_held(url, fake_cuda, torch_like):
    """A result in place given back as the next request's out= is named in its slot's registration:
    nothing registered again, nothing held by the lent table, and the slot back once it is gone."""
    x = torch_like.from_numpy(np.full(N, 3.0, np.float32))
    with tritonshm.Client(url) as c:
        c.infer(MODEL, {"INPUT0": x})  # the pool is made
        result = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
        assert in_a_slot(c, result)
        registered = c.stats().registrations
        x.copy_(np.full(N, 5.0, np.float32))
        assert c.infer(MODEL, {"INPUT0": x}, out={"OUTPUT0": result})["OUTPUT0"] is result
        np.testing.assert_array_equal(result.get(), np.full(N, 5.0, np.float32))
        stats = c.stats()
        assert stats.outputs_lent == 1 and stats.registrations == registered
        del result
        gc.collect()
        assert all(pool.held == 0 for pool in c.pools())


def test_threads_keeping_and_dropping_results_each_get_their_own(url, fake_cuda, torch_like):
    """Eight threads, each with its own lent input, keep some results and drop others while the
    pool's four slots go to results in place, copies and growth: every result kept is its own
    request's, intact after all the others ran."""
    threads, requests = 8, 40
    inputs = [torch_like.zeros(N) for _ in range(threads)]
    with tritonshm.Client(url, slots=4) as c:
        c.infer(MODEL, {"INPUT0": inputs[0]})  # the pool is made

        def work(t: int) -> list:
            kept = []
            for i in range(requests):
                value = float(t * 1000 + i)
                inputs[t].fill_(value)  # (queued on this thread's stream: the request orders after it)
                out = c.infer(MODEL, {"INPUT0": inputs[t]})["OUTPUT0"]
                if i % 3:  # two of three kept, the third dropped at once
                    kept.append((value, out))
            return kept

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            results = [kept for kept in pool.map(work, range(threads))]
        in_place = 0
        for kept in results:
            for value, out in kept:
                np.testing.assert_array_equal(out.get(), np.full(N, value, np.float32))
                in_place += in_a_slot(c, out)
        assert in_place  # (some were slots: the test ran what it is about)
        del results, kept, out
        gc.collect()
