"""What one warm GPU request costs in CUDA calls (issue 40): a budget, checked on the FAKE runtime.

A real Triton with the fake CUDA runtime LD_PRELOADed (``fake_cuda_server``) answers; the client's
tensors come from the torch-like double with a caching allocator (``torch_caching``).  The fake
counts every call of every entry point in this process (:meth:`fake_cuda.FakeCudart.calls`) in two
books: tritonshm's, and the double's own (torch's handshakes, guards and allocations, which a real
torch makes too: reported, not budgeted).  Each variant is warmed up, then run several times, and
the calls per request are checked against the issue's limits:

* lent input + lent ``out=``: no allocation, no copy, at most one event recorded by us, exactly one
  CPU wait (an event's: no stream, device or legacy-stream synchronize), no ``cudaIpcGetMemHandle``
  (the driver's buffer id says the allocation is the one registered), one request sent and no
  other call to the server (sent as a ready message: a test of its own), and nothing checked or
  routed again (the plan of the request seen before holds);
* lent input, ``CudaArray`` results (the double's tensors are not torch's, so results are
  tritonshm's own): written by the server in place, in the slot they hold -- no copy, no allocation,
  at most one event recorded and one CPU wait (the input's);
* lent input, results copied (a pool of one slot has none to spare for results in place): one
  async copy, at most one CPU wait, no ``cudaMalloc``/``cudaFree`` per request;
* zero-copy ``request().run()`` on a CUDA slot: at most one event recorded and one wait;
* every warm GPU request: no ``cudaGetDeviceCount``, at most four ``cudaGetDevice`` (but a copy out
  of a pool's one slot, which asks whether the last copy out of it is done before leasing it again).

Each test collects every limit it breaks and fails naming them all, with the calls it counted (so a
run on older code says by how much).  Safety is the fake's to enforce meanwhile: work lands only where
something synchronizes it, and memory freed under the server or under queued work fails the test.
"""

from __future__ import annotations

import collections
import gc
from typing import Any, Callable

import numpy as np
import pytest

import tritonshm
from tritonshm.client import _steps

from support.insides import wrap_step
from triton_fixtures import client_url

N = 16384            # 64 KiB of float32
WARM = 3             # requests before counting (registrations, pools, quick plans made)
REQUESTS = 8         # requests counted
MODEL = "identity_fp32"

ALLOCATIONS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocManaged", "cudaHostAlloc",
               "cudaFreeHost")
COPIES = ("cudaMemcpy", "cudaMemcpyAsync")
WAITS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")
SERVER_STEPS = (_steps.Register, _steps.Unregister, _steps.FetchModel, _steps.FetchModelNames,
                _steps.FetchServerVersion, _steps.StreamSend)


@pytest.fixture
def url(fake_cuda_server, fake_cuda):
    return client_url(fake_cuda_server, "grpc")


class Counted:
    """What *REQUESTS* warm requests cost, per request: tritonshm's calls (*ours*), the double's
    (*theirs*), the fake's counters (*stats*) and the client's steps (*steps*, by type name;
    ``"ready"``: Send steps carrying a ready message; ``"plans"``: requests checked and routed)."""

    def __init__(self, ours, theirs, stats, steps, requests):
        self.ours, self.theirs, self.stats, self.steps, self.requests = ours, theirs, stats, steps, requests
        self.stream_compares = 0  # exports the producer double was asked to order (measure(producer=))
        self.device_queries = 0  # __dlpack_device__ calls the producer double answered (measure(producer=))

    def per_request(self, *names: str) -> float:
        return sum(self.ours.get(name, 0) for name in names) / self.requests

    def __str__(self) -> str:
        def each(counter):
            return {name: round(n / self.requests, 2) for name, n in sorted(counter.items())}

        return (f"per request -- tritonshm's CUDA calls: {each(self.ours)}; the double's (torch's own): "
                f"{each(self.theirs)}; steps: {each(self.steps)}; legacy-stream syncs: "
                f"{self.stats.legacy_syncs / self.requests}")


def count_steps(client) -> collections.Counter:
    """A counter of the steps *client*'s driver carries out from now on, by type name."""
    seen: collections.Counter = collections.Counter()

    def watch(step_type):
        def wrap(handler):
            def counted(step):
                seen[step_type.__name__] += 1
                if step_type is _steps.Send and step.message is not None:
                    seen["ready"] += 1
                return handler(step)
            return counted
        return wrap

    for step_type in list(client._driver.handlers):
        wrap_step(client, step_type, watch(step_type))
    return seen


def count_plans(client, seen: collections.Counter) -> None:
    """Count in *seen* (as ``"plans"``) the requests *client* checks and routes from now on: a
    warm request seen before takes the plan made then."""
    planner = client._engine.planner
    plan = planner.plan

    def counted(*args, **kwargs):
        seen["plans"] += 1
        return plan(*args, **kwargs)

    planner.plan = counted


def measure(fake, client, call: Callable[[], Any], requests: int = REQUESTS, producer: Any = None) -> Counted:
    """*call* made WARM times, then *requests* times counted (with *producer*, the double, its
    exports asked to compare streams too)."""
    for _ in range(WARM):
        call()
    gc.collect()
    steps = count_steps(client)
    count_plans(client, steps)
    ours, theirs, stats = fake.calls(), fake.calls(foreign=True), fake.stats()
    compares = producer.stream_compares if producer is not None else 0
    queries = producer.device_queries if producer is not None else 0
    for _ in range(requests):
        call()
    counted = Counted(fake.calls() - ours, fake.calls(foreign=True) - theirs, fake.stats() - stats,
                      collections.Counter(steps), requests)
    counted.stream_compares = (producer.stream_compares - compares) if producer is not None else 0
    counted.device_queries = (producer.device_queries - queries) if producer is not None else 0
    print(counted)
    return counted


class Limits:
    """The limits a variant breaks, each with what was counted."""

    def __init__(self, counted: Counted):
        self.counted = counted
        self.broken: list[str] = []

    def at_most(self, what: str, value: float, limit: float) -> None:
        if value > limit:
            self.broken.append(f"{what}: {value:g} per request, limit {limit:g}")

    def exactly(self, what: str, value: float, limit: float) -> None:
        if value != limit:
            self.broken.append(f"{what}: {value:g} per request, limit exactly {limit:g}")

    def every_gpu_request(self) -> None:
        c = self.counted
        self.at_most("cudaGetDeviceCount", c.per_request("cudaGetDeviceCount"), 0)
        self.at_most("cudaGetDevice", c.per_request("cudaGetDevice"), 4)

    def one_request_sent(self, ready: bool = True) -> None:
        c = self.counted
        self.at_most("requests checked and routed again (planned)", c.steps["plans"] / c.requests, 0)
        self.exactly("requests sent (Send steps)", c.steps["Send"] / c.requests, 1)
        if ready:
            self.exactly("requests sent as a ready message", c.steps["ready"] / c.requests, 1)
        other = sum(c.steps[t.__name__] for t in SERVER_STEPS)
        self.at_most("other calls to the server", other / c.requests, 0)

    def check(self) -> None:
        if self.broken:
            pytest.fail("over the budget:\n  " + "\n  ".join(self.broken) + f"\n{self.counted}", pytrace=False)


def test_lent_input_and_lent_out(url, fake_cuda, torch_caching):
    data = np.arange(N, dtype=np.float32)
    x = torch_caching.from_numpy(data)
    y = torch_caching.empty(N, np.float32)
    with tritonshm.Client(url) as c:
        def call():
            got = c.infer(MODEL, {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"]
            assert got is y

        counted = measure(fake_cuda, c, call, producer=torch_caching)
        np.testing.assert_array_equal(y.numpy(), data)
        stats = c.stats()
        assert (stats.inputs_lent, stats.outputs_lent, stats.copied) == (WARM + REQUESTS, WARM + REQUESTS, {})
    limits = Limits(counted)
    # both tensors on torch's current stream, the one the request orders on: no handshake asked of
    # torch (each is four Python stream look-ups, ~20 us per tensor on an H200)
    limits.at_most("torch stream handshakes", counted.stream_compares / counted.requests, 0)
    # where each tensor lives asked once: torch's __dlpack_device__ is Python (a torch.device made,
    # an enum looked up), and the client's check, capture() and the import each asked it
    limits.at_most("__dlpack_device__ calls per tensor", counted.device_queries / counted.requests / 2, 1)
    limits.at_most("allocations", counted.per_request(*ALLOCATIONS), 0)
    limits.at_most("copies", counted.per_request(*COPIES), 0)
    limits.at_most("event records of ours", counted.per_request("cudaEventRecord"), 1)
    limits.exactly("CPU waits", counted.per_request(*WAITS), 1)
    limits.at_most("stream synchronizes", counted.per_request("cudaStreamSynchronize"), 0)
    limits.at_most("device synchronizes", counted.per_request("cudaDeviceSynchronize"), 0)
    limits.at_most("legacy-stream synchronizes", counted.stats.legacy_syncs / counted.requests, 0)
    # the registered allocations known by the driver's id of them: no borrow, no IPC export
    limits.at_most("cudaIpcGetMemHandle", counted.per_request("cudaIpcGetMemHandle"), 0)
    limits.at_most("cuMemGetAddressRange", counted.per_request("cuMemGetAddressRange"), 0)
    limits.one_request_sent(ready=False)
    limits.every_gpu_request()
    limits.check()


def test_lent_input_and_lent_out_go_as_a_ready_message(url, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.arange(N, dtype=np.float32))
    y = torch_caching.empty(N, np.float32)
    with tritonshm.Client(url) as c:
        counted = measure(fake_cuda, c, lambda: c.infer(MODEL, {"INPUT0": x}, out={"OUTPUT0": y}))
    limits = Limits(counted)
    limits.one_request_sent(ready=True)
    limits.check()


def copied_results(url, fake, torch_caching, slots: int = 1) -> Counted:
    data = np.arange(N, dtype=np.float32)
    x = torch_caching.from_numpy(data)
    kept = []
    with tritonshm.Client(url, slots=slots) as c:
        def call():
            out = c.infer(MODEL, {"INPUT0": x})["OUTPUT0"]
            assert isinstance(out, tritonshm.CudaArray)
            kept[:] = [out]  # the previous result dropped as a caller's loop drops it

        counted = measure(fake, c, call)
        np.testing.assert_array_equal(kept[0].get(), data)
        kept.clear()
        gc.collect()
        assert c.stats().copied == {}
    return counted


def test_lent_input_cudaarray_results_written_in_place(url, fake_cuda, torch_caching):
    """The double's tensors are not torch's, so results are tritonshm's own CudaArrays: the slot the
    server wrote them in, while the pool has a slot to spare -- nothing copied or allocated."""
    counted = copied_results(url, fake_cuda, torch_caching, slots=4)
    limits = Limits(counted)
    limits.at_most("copies", counted.per_request(*COPIES), 0)
    limits.at_most("allocations", counted.per_request(*ALLOCATIONS), 0)
    limits.at_most("event records of ours", counted.per_request("cudaEventRecord"), 1)
    limits.exactly("CPU waits", counted.per_request(*WAITS), 1)
    limits.one_request_sent(ready=False)
    limits.every_gpu_request()
    limits.check()


def test_lent_input_copied_results(url, fake_cuda, torch_caching):
    """Results copied out of the slot (a pool of one slot: none to spare to keep as a result) into
    CudaArrays of cached blocks: no cudaMalloc/cudaFree per request."""
    counted = copied_results(url, fake_cuda, torch_caching)
    limits = Limits(counted)
    limits.exactly("async copies", counted.per_request("cudaMemcpyAsync"), 1)
    limits.at_most("synchronous copies", counted.per_request("cudaMemcpy"), 0)
    limits.at_most("cudaMalloc/cudaFree (CudaArray results)", counted.per_request(*ALLOCATIONS), 0)
    limits.at_most("cudaGetDeviceCount", counted.per_request("cudaGetDeviceCount"), 0)
    limits.at_most("event records of ours", counted.per_request("cudaEventRecord"), 2)
    limits.at_most("events made or destroyed", counted.per_request("cudaEventCreateWithFlags",
                                                                   "cudaEventDestroy"), 0)
    # the copy is queued on the caller's stream itself: nothing of it to wait for there
    limits.at_most("streams made to wait", counted.per_request("cudaStreamWaitEvent"), 0)
    limits.one_request_sent(ready=False)
    limits.check()


def test_lent_input_copied_results_wait_once(url, fake_cuda, torch_caching):
    # (cudaGetDevice is not limited here: the one slot is asked, under a device guard, whether the
    # copy out of it is done before it is leased again -- the cost of a pool with no slot to spare)
    counted = copied_results(url, fake_cuda, torch_caching)
    limits = Limits(counted)
    limits.at_most("CPU waits", counted.per_request(*WAITS), 1)
    limits.check()


def test_zero_copy_run(url, fake_cuda, torch_caching):
    data = np.arange(N, dtype=np.float32)
    with tritonshm.Client(url) as c:
        with c.request(MODEL, shapes={"INPUT0": [N]}, device="cuda") as req:
            x = torch_caching.from_dlpack(req.inputs["INPUT0"])
            x.copy_(data)  # queued on the caller's stream: run() orders the request after it

            def call():
                outputs = req.run()
                assert isinstance(outputs["OUTPUT0"], tritonshm.CudaArray)

            counted = measure(fake_cuda, c, call)
            np.testing.assert_array_equal(req.run()["OUTPUT0"].get(), data)
            del x
    limits = Limits(counted)
    limits.at_most("event records", counted.per_request("cudaEventRecord"), 1)
    limits.at_most("CPU waits", counted.per_request(*WAITS), 1)
    limits.at_most("allocations", counted.per_request(*ALLOCATIONS), 0)
    limits.at_most("copies", counted.per_request(*COPIES), 0)
    limits.one_request_sent(ready=False)
    limits.every_gpu_request()
    limits.check()
