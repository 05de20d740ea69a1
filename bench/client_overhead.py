#!/usr/bin/env python3
"""What a call costs on the client side alone: the server replaced by a recorded response.

Issue 20's budget (client-side work on a cache hit, at 4 KiB) is measured
here, not in the end-to-end bench, where the server's ~400 us hide it.  One
real call to a local Triton records each method's response; then every
method runs with its transport call answered by that recording, so what is
timed is the library's own Python: checks, planning, the slot lease, the
copies in and out, building the request, reading the response.

    python bench/client_overhead.py              # starts a LocalServer, ~20 s
    python bench/client_overhead.py --size 65536 --reps 3000
    python bench/client_overhead.py --cold       # each call after 32 MiB of copying: thread CPU, us
    python bench/client_overhead.py --lend       # the lend hit path, on the FAKE CUDA runtime
    python bench/client_overhead.py --gpu        # GPU requests vs the floor, FAKE runtime + real Triton

Methods, interleaved in rounds (median us per call, and the ratio to
tritonclient's own infer with the same recorded answer):

* ``tritonclient``: ``InferenceServerClient.infer`` on a prebuilt
  InferInput (set_data_from_numpy each call), the gRPC stub answered.
* ``Client.infer``: tritonshm's copy-mode path, system shared memory.
* ``request().run()``: the zero-copy path, the inputs already in place.
* ``Client.infer http`` / ``request().run() http``: the same on a client made
  with the server's ``http://`` URL, its socket's ``send`` answered by the
  recorded result (so, like the gRPC stub's recording, what is left out is
  the transport: writing the request, reading and parsing the answer).

``--cold`` times each call alone, after an untimed copy of ``--evict-bytes``
(32 MiB: what a 16 MiB request moves through the caches, in and out), in
microseconds of the calling thread's CPU (``time.thread_time``): the client's
Python as a large request pays it, its code and data evicted between calls --
several times its cost in a loop -- which is what separates the zero-copy row
from the limit in ``tritonshm bench`` at 16 MiB.  ``request() + run()`` is the
zero-copy row's call: a slot leased per request, the input copied in, run,
closed (the other ``request().run()`` rows reuse one request).

``--gpu`` measures the GPU rows (issue 40) on the FAKE CUDA runtime, against a
real Triton with the fake preloaded (no GPU): the client thread's CPU per warm
request (``time.thread_time``: waits for the server are not in it) of each way
of sending a 64 KiB GPU tensor, against the floor in the same process -- a
by-reference request built by hand with tritonclient (input and output
regions registered once, the InferInput bound to them once: no CUDA call per
request) -- each method in runs of calls of its own, interleaved, the first of each run left
out (a call after another method finds that method's code warm or cold, not its own) -- and the
CUDA calls each makes per request, as the fake counts them; then each
method's own work alone, its gRPC answered by a recorded response in a hot loop (no server, no
gRPC: the steadier figure for an A/B on a loaded machine).
Tensors come from the torch-like double (tests/fake_producers.py), whose own
calls are Python over ctypes, not torch's C++: its handshakes are in the
client's CPU here and cost more than torch's would: each row is given again
"less the double", those calls' own thread CPU left out (timed as they run,
and the timing's own cost, calibrated, left out too).  The issue's targets:
zero-copy within 1.2x of the floor, lent ``out=`` 1.6x, lent input with copied
results 2x (the ``CudaArray`` results row: written in place where the pool has a slot to spare,
as here).  Figures, never asserted.

``--lend`` measures instead what sending one GPU tensor by reference adds to
a request once its allocation is registered (no server, no GPU: the fake CUDA
runtime of tests/fake_cudart, built on the spot): the lent table's hit path
(``cuMemGetAddressRange`` and ``cudaIpcGetMemHandle``, then bookkeeping) alone,
and with the request's :class:`~tritonshm.client._claim.Claim` made, lent and
ended around it (what issue 30 added).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from tritonshm import _tritonclient_compat


class _Recorded:
    """A gRPC method (*real*) that answers every call with the response of its first real one."""

    def __init__(self, real):
        self._real, self._answer = real, []

    def __call__(self, request, **kwargs):
        if not self._answer:
            self._answer.append(self._real(request, **kwargs))
        return self._answer[0]

    def with_call(self, request, **kwargs):
        if not self._answer:
            self._answer.append(self._real.with_call(request, **kwargs))
        return self._answer[0]


def _recorded_stub(client, method: str):
    """Make *client*'s gRPC stub answer *method* with the response of one real call."""
    stub = _tritonclient_compat.grpc_stub(client)
    setattr(stub, method, _Recorded(getattr(stub, method)))
    channel = getattr(client, "_channel", None)
    if channel is not None:  # tritonshm's ready requests go on the channel itself, as bytes
        client._channel = _RecordedChannel(channel, method)


class _RecordedChannel:
    """A gRPC channel whose *method* answers with the response of its first real call, as
    :func:`_recorded_stub`'s stub does (the rest is the channel's)."""

    def __init__(self, channel, method: str):
        self._channel, self._method = channel, method

    def unary_unary(self, path: str, *args, **kwargs):
        real = self._channel.unary_unary(path, *args, **kwargs)
        return _Recorded(real) if path.endswith("/" + self._method) else real

    def __getattr__(self, name: str):
        return getattr(self._channel, name)


def _recorded_http(client) -> None:
    """Make a tritonshm HTTP client's own connections answer with the result of one real call."""
    connections = client._driver._http1
    real = connections.send
    answer = {}

    def send(request, again=None):
        if "result" not in answer:
            answer["result"] = real(request)
        return answer["result"]

    connections.send = send


def lend_hit_path(reps: int, rounds: int) -> int:
    """``--lend``: microseconds per lent tensor on a registered allocation (see the module)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fake_cuda import build_fake_cudart  # the FAKE runtime: test code, never shipped

    path = build_fake_cudart(tempfile.mkdtemp(prefix="tshm-fake-cudart-"))
    os.environ["TRITONSHM_CUDART"] = str(path)
    from tritonshm._memory import _runtime
    from tritonshm.client._claim import Claim, Claims
    from tritonshm.client._devices import as_device_tensor
    from tritonshm.client._lent import LentAllocations
    from tritonshm.cuda import CudaRegion

    _runtime.use(str(path))
    region = CudaRegion.create(1 << 20)
    tensor = as_device_tensor(region.view(np.float32, (1024,), offset=4096))
    table, claims = LentAllocations(1 << 30, os.getpid(), []), Claims()

    def drive(steps):  # a Register (the first time only) answered with a name
        try:
            next(steps)
            while True:
                steps.send("tritonshm-lent-bench")
        except StopIteration as stop:
            return stop.value

    table.finished([drive(table.lend_steps(tensor))])

    def table_alone():
        table.finished([drive(table.lend_steps(tensor))])

    def with_claim():
        claim = Claim(claims, table)
        claim.lend("INPUT0", drive(table.lend_steps(tensor)), tensor, writes=False)
        claim.end()

    methods = {"lent table hit": table_alone, "hit + request claim": with_claim}
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples[name].append((time.perf_counter() - t0) / reps * 1e6)
    print(f"lending one GPU tensor of a registered allocation, FAKE CUDA runtime ({rounds} rounds x {reps}, "
          f"interleaved)")
    for name, values in samples.items():
        print(f"  {name:21s} {statistics.median(values):8.2f} us/tensor")
    for extent in table.forget():
        extent.release_memory()
    region.close()
    return 0


#: Calls of one method in a row, the first of each left out: each call measured is one after a
#: call of its own -- as an application making one kind of request sees it -- not after another
#: method, whose code and data (tritonclient's protobuf building and parsing, say, or none of
#: it) would be warm or cold for it by the order of the methods.
RUN = 10


def _in_runs(methods: dict[str, Callable[[], Any]], rounds: int, reps: int,
             not_its_own: Callable[[], int] | None = None) -> dict[str, list[float]]:
    """Thread CPU (us) of *reps* calls of each method per round, in runs of :data:`RUN` calls of
    one method, the methods' runs interleaved; less, per call, what *not_its_own* (a counter of
    nanoseconds) grew by during it."""
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for _ in range(max(1, reps // RUN)):
            for name, fn in methods.items():
                fn()  # (after another method's call: not counted)
                for _ in range(RUN):
                    before = 0 if not_its_own is None else not_its_own()
                    t0 = time.thread_time_ns()
                    fn()
                    elapsed = time.thread_time_ns() - t0
                    if not_its_own is not None:
                        elapsed -= not_its_own() - before
                    samples[name].append(elapsed / 1e3)
    return samples


#: The double's timed deleters, kept for the process's life, as the double keeps its own.
_CALLBACKS_KEPT: list[Any] = []


@contextlib.contextmanager
def _the_doubles_cpu(producer) -> Iterator[tuple[Callable[[], int], float]]:
    """While in the block, the torch-like double *producer*'s own calls (its exports, where its
    tensors live, its streams, its allocations: what torch does in C++, the double in Python over
    ctypes; and its DLPack deleters, ctypes callbacks into Python where torch's are C) are timed;
    yields a counter of the nanoseconds of thread CPU that are not tritonshm's --
    those calls', and the timing's own outside what it timed (a Python call and two clock reads,
    each a system call: calibrated here on a call that does nothing) -- and that calibration, in
    nanoseconds per call timed."""
    from tritonshm._memory import _stream

    spent = [0, 0]  # ns inside the double's calls, calls timed
    clock = time.thread_time_ns

    def counted(call):
        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return call(*args, **kwargs)
            finally:
                spent[0] += clock() - t0
                spent[1] += 1
        return timed

    overhead = _timing_overhead(counted, spent)
    import fake_producers

    deleters = fake_producers._DELETER, fake_producers._CAPSULE_DESTRUCTOR
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    timed_deleters = (callback(counted(fake_producers._release_export)),
                      callback(counted(fake_producers._capsule_destructor)))
    _CALLBACKS_KEPT.append(timed_deleters)  # (a capsule made in the block may die after it)
    kind = producer.tensor_type
    saved = [(owner, name, owner.__dict__[name]) for owner, names in
             ((kind, ("__dlpack__", "__dlpack_device__")),
              (producer, ("current_stream", "current_stream_provider", "empty")))
             for name in names if name in owner.__dict__]
    providers, readers = list(_stream.current_stream_providers), dict(_stream.producer_streams)
    for owner, name in ((kind, "__dlpack__"), (kind, "__dlpack_device__"), (producer, "current_stream"),
                        (producer, "current_stream_provider"), (producer, "empty")):
        setattr(owner, name, counted(getattr(owner, name)))
    # tritonshm holds the double's bound methods: handed the timed ones
    _stream.producer_streams[kind] = producer.current_stream
    _stream.current_stream_providers[:] = [producer.current_stream_provider if getattr(p, "__self__", None)
                                           is producer else p for p in providers]
    fake_producers._DELETER, fake_producers._CAPSULE_DESTRUCTOR = timed_deleters  # (read as each export is made)
    try:
        yield (lambda: spent[0] + round(spent[1] * overhead)), overhead
    finally:
        for owner in (kind, producer):
            for name in ("__dlpack__", "__dlpack_device__", "current_stream", "current_stream_provider", "empty"):
                if name in owner.__dict__:
                    delattr(owner, name)
        for owner, name, value in saved:
            setattr(owner, name, value)
        _stream.current_stream_providers[:] = providers
        _stream.producer_streams.clear()
        _stream.producer_streams.update(readers)
        fake_producers._DELETER, fake_producers._CAPSULE_DESTRUCTOR = deleters


def _timing_overhead(counted: Callable[[Callable[[], None]], Callable[[], None]], spent: list[int],
                     calls: int = 2000, rounds: int = 7) -> float:
    """Nanoseconds of thread CPU that timing one call with *counted* adds outside the time it
    counts into *spent* (then reset): a timed call that does nothing, less the same call untimed;
    median of *rounds*."""
    clock = time.thread_time_ns

    def nothing() -> None:
        return None

    timed = counted(nothing)
    samples = []
    for _ in range(rounds):
        inside = spent[0]
        t0 = clock()
        for _ in range(calls):
            timed()
        outside = clock() - t0 - (spent[0] - inside)
        t0 = clock()
        for _ in range(calls):
            nothing()
        samples.append((outside - (clock() - t0)) / calls)
    spent[:] = [0, 0]
    return max(0.0, statistics.median(samples))


def gpu_rows(size: int, reps: int, rounds: int, profile: Sequence[str] = ()) -> int:
    """``--gpu``: client thread CPU per warm GPU request vs the floor, on the fake runtime (see the module)."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    import fake_cuda  # the FAKE runtime and the torch-like double: test code, never shipped
    from fake_producers import TorchLike

    path = fake_cuda.build_fake_cudart(tempfile.mkdtemp(prefix="tshm-fake-cudart-"))
    os.environ["TRITONSHM_CUDART"] = str(path)
    import tritonclient.grpc as grpcclient

    import tritonshm
    from tritonshm import cuda
    from tritonshm._memory import _runtime
    from tritonshm.server import LocalServer

    _runtime.use(str(path))
    fake = fake_cuda.FakeCudart(path)
    torch_like = TorchLike(fake, caching=True)
    cuda.current_stream_providers.insert(0, torch_like.current_stream_provider)
    from tritonshm._memory import _stream

    # tritonshm reads torch's own current stream (producer_stream_of): the double's, the same way
    _stream.producer_streams[torch_like.tensor_type] = torch_like.current_stream
    n = size // 4
    data = np.random.default_rng(0).random(n, dtype=np.float32)
    with LocalServer(quiet=True, env=fake_cuda.server_env(path)) as server:
        url = server.grpc_url
        # The floor: both regions registered once, the request's objects bound once.
        tc = grpcclient.InferenceServerClient(url)
        floor_in, floor_out = tritonshm.CudaRegion.create(size), tritonshm.CudaRegion.create(size)
        floor_in.write(data)
        names = [tritonshm.register(tc, region) for region in (floor_in, floor_out)]
        tc_input = grpcclient.InferInput("INPUT0", [n], "FP32")
        tritonshm.bind_input(tc_input, floor_in)
        tc_output = grpcclient.InferRequestedOutput("OUTPUT0")
        tritonshm.bind_output(tc_output, floor_out)

        c = tritonshm.Client(url)
        copier = tritonshm.Client(url, by_reference=False)
        x = torch_like.from_numpy(data)
        y = torch_like.empty(n, np.float32)
        request = c.request("identity_fp32", shapes={"INPUT0": [n]}, device="cuda")
        torch_like.from_dlpack(request.inputs["INPUT0"]).copy_(data)
        kept: list = []

        def floor():
            tc.infer("identity_fp32", [tc_input], outputs=[tc_output])

        def copied(client):
            def call():
                kept[:] = [client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]]
            return call

        methods = {
            "floor (tritonclient, regions bound once)": floor,
            "zero-copy request().run()": lambda: request.run(),
            "Client.infer lent input + lent out=": lambda: c.infer("identity_fp32", {"INPUT0": x},
                                                                    out={"OUTPUT0": y}),
            "Client.infer lent input, CudaArray results": copied(c),
            "Client.infer copies (by_reference=False)": copied(copier),
        }
        calls = {}
        for name, fn in methods.items():  # warm up (registrations, pools, plans), then count the calls
            for _ in range(5):
                fn()
            before = fake.calls()
            for _ in range(10):
                fn()
            calls[name] = {k: v / 10 for k, v in sorted((fake.calls() - before).items())}
        samples = _in_runs(methods, rounds, reps)
        # Then rounds as many again with the double's own calls timed (which adds a Python call and
        # its clock reads to each, left out too: these give only the rows less the double's share)
        with _the_doubles_cpu(torch_like) as (not_ours, timing):
            alone = _in_runs(methods, rounds, reps, not_ours)
        np.testing.assert_array_equal(y.numpy(), data)
        np.testing.assert_array_equal(kept[0].get(), data)
        floor_name = "floor (tritonclient, regions bound once)"
        base = statistics.median(samples[floor_name])
        print(f"client thread CPU per warm GPU request, {size} B FP32 identity, FAKE CUDA runtime, real Triton "
              f"({rounds} rounds x {reps} calls, in runs of {RUN} calls of one method, interleaved, the first of "
              f"each run left out; median; 'less the double': as many rounds again, "
              f"less what the torch-like double's own Python took of each call -- torch's exports, stream and "
              f"device look-ups, allocations, which torch does in C++ -- and what timing it took: "
              f"{timing:.0f} ns a call)")
        base_alone = statistics.median(alone[floor_name])
        for name, values in samples.items():
            median, ours_alone = statistics.median(values), statistics.median(alone[name])
            ours = calls[name]
            print(f"  {name:44s} {median:8.1f} us   x{median / base:5.2f} of the floor   less the double: "
                  f"{ours_alone:6.1f} us x{ours_alone / base_alone:5.2f}")
            print(f"  {'':44s} CUDA calls/request: {sum(ours.values()):g} {ours}")

        # The client's own work alone, in a hot loop: every gRPC stub answers with a recorded
        # response (the same shapes and datatypes; results are read from where they were), so
        # neither the server nor gRPC's own CPU -- nor the caches they sweep between requests,
        # several times this work above -- is in it.  Steadier than the rows above on a loaded machine.
        _recorded_stub(tc, "ModelInfer")
        for client in (c, copier):
            _recorded_stub(client.tritonclient, "ModelInfer")
            client._driver._grpc_send = None  # it bound the stub's ModelInfer at its first send
        for fn in methods.values():  # record (the first call through each stub goes out once)
            fn()
        hot: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(rounds):
            for name, fn in methods.items():
                t0 = time.thread_time_ns()
                for _ in range(reps * 5):
                    fn()
                hot[name].append((time.thread_time_ns() - t0) / (reps * 5) / 1e3)
        # What the double's own DLPack export costs per tensor taken (every input and out= tensor of
        # a call): Python here, torch's C++ (a few us) on a GPU -- in the rows above and below.
        s = torch_like.current_stream_provider(0) or 1
        t0 = time.thread_time_ns()
        for _ in range(reps * 5):
            x.__dlpack__(stream=s)
        double = (time.thread_time_ns() - t0) / (reps * 5) / 1e3
        print(f"client work alone, server answered by a recorded response ({rounds} rounds x {reps * 5} calls, "
              f"hot loop; best round; the double's own __dlpack__ is {double:.1f} us of each tensor taken)")
        for name, values in hot.items():
            print(f"  {name:44s} {min(values):8.1f} us")
        for name in profile:
            import cProfile
            import pstats

            fn = next(f for label, f in methods.items() if label.startswith(name))
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(reps * 5):
                fn()
            profiler.disable()
            print(f"\n== {name}: {reps * 5} calls of the hot loop under cProfile")
            pstats.Stats(profiler).strip_dirs().sort_stats("tottime").print_stats(30)
        kept.clear()
        request.close()
        c.close()
        copier.close()
        for name in names:
            tritonshm.unregister(tc, name)
        tc.close()
        floor_in.close()
        floor_out.close()
        del x, y
        fake.discard_pending()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="input bytes (FP32 identity)")
    parser.add_argument("--reps", type=int, help="calls per method per round (default 2000; --cold: 200)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running server's gRPC address (default: start a LocalServer)")
    parser.add_argument("--http-url", help="with --url: its HTTP address, for the HTTP rows (left out without)")
    parser.add_argument("--cold", action="store_true",
                        help="time each call alone, after an untimed copy of --evict-bytes, in thread CPU us "
                             "(default --reps 200)")
    parser.add_argument("--evict-bytes", type=int, default=32 << 20, help="with --cold: bytes copied before each call")
    parser.add_argument("--lend", action="store_true",
                        help="measure the lend hit path instead, on the fake CUDA runtime (no server, no GPU)")
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU rows instead: client thread CPU of warm GPU requests vs the floor, on the "
                             "fake CUDA runtime against a real Triton (default --size 65536, --reps 200)")
    parser.add_argument("--profile", nargs="+", default=[], metavar="ROW",
                        help="with --gpu: then these rows' hot loop under cProfile (a row's name or its start, "
                             "e.g. 'Client.infer lent input + lent out=')")
    args = parser.parse_args()
    if args.reps is None:
        args.reps = 200 if args.cold or args.gpu else 2000
    if args.lend:
        return lend_hit_path(args.reps, args.rounds)
    if args.gpu:
        return gpu_rows(65536 if args.size == 4096 else args.size, args.reps, args.rounds, args.profile)

    import tritonclient.grpc as grpcclient

    import tritonshm
    from tritonshm.server import LocalServer

    server = None
    url, http_url = args.url, args.http_url
    if url is None:
        server = LocalServer(quiet=True).start()
        url, http_url = server.grpc_url, server.http_url
    x = np.random.default_rng(0).random(args.size // 4, dtype=np.float32)
    try:
        tc = grpcclient.InferenceServerClient(url)
        tc_input = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tc_output = grpcclient.InferRequestedOutput("OUTPUT0")
        c = tritonshm.Client(url, transport="shm")
        request = c.request("identity_fp32", shapes={"INPUT0": x.shape})
        request.inputs["INPUT0"][:] = x
        h = tritonshm.Client("http://" + http_url, transport="shm") if http_url else None
        h_request = None
        if h is not None:
            h_request = h.request("identity_fp32", shapes={"INPUT0": x.shape})
            h_request.inputs["INPUT0"][:] = x

        def tritonclient_infer():
            tc_input.set_data_from_numpy(x)
            return tc.infer("identity_fp32", [tc_input], outputs=[tc_output]).as_numpy("OUTPUT0")

        def request_and_run():  # the bench's zero-copy row: a slot leased per request
            with c.request("identity_fp32", shapes={"INPUT0": x.shape}) as leased:
                np.copyto(leased.inputs["INPUT0"], x)
                return leased.run()["OUTPUT0"]

        methods = {
            "tritonclient": tritonclient_infer,
            "Client.infer": lambda: c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"],
            "request().run()": lambda: request.run()["OUTPUT0"],
            "request() + run()": request_and_run,
        }
        if h is not None:
            methods["Client.infer http"] = lambda: h.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            methods["request().run() http"] = lambda: h_request.run()["OUTPUT0"]
        for fn in methods.values():  # warm up and check, against the real server
            np.testing.assert_array_equal(fn(), x)
        _recorded_stub(tc, "ModelInfer")
        for connection in {id(k): k for k in [c.tritonclient]}.values():
            _recorded_stub(connection, "ModelInfer")
        c._driver._grpc_send = None  # it bound the stub's ModelInfer at its first send: again, to the recording
        if h is not None:
            _recorded_http(h)
        for fn in methods.values():  # record (the first call through each stub goes out once)
            np.testing.assert_array_equal(fn(), x)

        samples = {name: [] for name in methods}
        if args.cold:
            # Each call alone, after the caches were swept: the median of every call, thread CPU.
            sweep_from = np.ones(args.evict_bytes, np.uint8)
            sweep_to = np.zeros_like(sweep_from)
            for _ in range(args.rounds):
                for _ in range(args.reps):
                    for name, fn in methods.items():
                        np.copyto(sweep_to, sweep_from)
                        t0 = time.thread_time_ns()
                        fn()
                        samples[name].append((time.thread_time_ns() - t0) / 1e3)
            how = f"each call after an untimed {args.evict_bytes >> 20} MiB copy, thread CPU"
        else:
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        fn()
                    samples[name].append((time.perf_counter() - t0) / args.reps * 1e6)
            how = "interleaved"
        base = statistics.median(samples["tritonclient"])
        print(f"client side alone, {args.size} B FP32 identity, server answered by a recorded response "
              f"({args.rounds} rounds x {args.reps} calls, {how})")
        for name, values in samples.items():
            median = statistics.median(values)
            print(f"  {name:21s} {median:8.1f} us/call   x{median / base:5.2f} of tritonclient")
        request.close()
        c.close()
        if h is not None:
            h_request.close()
            h.close()
        tc.close()
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
