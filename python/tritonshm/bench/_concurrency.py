"""``tritonshm bench --concurrency N``: requests/s of N concurrent callers on ONE client, two ways each.

The model is the bundled ``identity_fp32``.  Each measurement starts N
callers together and lets each send request after request on the one
shared client for ``duration`` seconds; its rate is every caller's
completed requests over the time from the start to the last one's end.

Methods, in two pairs (each compared within its pair):

* threads -- N threads sharing one client:
  ``tc-grpc-threads`` (one ``tritonclient.grpc.InferenceServerClient``,
  plain gRPC, tensors in the messages), ``tc-shm-threads`` (the same
  client, tritonclient's system shared-memory utilities: an input and an
  output region per thread, made and registered once, copy in and copy out
  per request, as ``tc-shm`` does) and ``Client-threads`` (one
  ``tritonshm.Client(url, transport="shm", slots=N)``, ``infer``); the
  tritonclient side of the ratio is the better of the two tc methods at
  each size (by median requests/s), named in ``tritonclient``;
* asyncio -- N tasks on one event loop sharing one client:
  ``tc-grpc-aio`` (one ``tritonclient.grpc.aio.InferenceServerClient``,
  plain gRPC) and ``Client-aio`` (one ``tritonshm.aio.Client(url,
  transport="shm", slots=N)``).

Measurements are interleaved in rounds: every method once per round, the
order drawn anew each round, after ``warmup`` shorter warm-up
rounds.  Every caller sends its own inputs (two per caller, alternating),
so an answer crossing over to another caller, or a stale one, differs from
what that caller sent.  Every output's dtype and shape is checked; its
contents are checked bit for bit for every request up to
``CHECK_ALL_BYTES`` and, above that, for one request in ``CHECK_STRIDE``
(an odd stride, so both inputs of a caller are checked) -- comparing every
MiB would itself take a share of a small machine's CPUs; the counts checked
are in the results.  After the rounds a last measurement-free pass sends
every caller one fresh input never sent before, checked in full.

Results (what ``--json`` writes)::

    {"format": "tritonshm-bench-concurrency/1",
     "meta": {model, datatype, concurrency, duration_s, rounds, warmup, sizes, server_version,
              tritonshm_version, cpu_count, versions, methods {name: {group, mode, description, status}},
              pairs {mode: {"tritonshm": name, "tritonclient": [names]}}, checks, ...},
     "results": [{"nbytes", "elements", "rounds", "seconds", "checked_every",
                  "methods": {name: {"status": "ok", "requests_per_s": [one per round],
                                     "median_requests_per_s", "p25_requests_per_s", "p75_requests_per_s",
                                     "requests": [per round], "checked": [per round]}},
                  "ratios": {mode: {"tritonshm", "tritonclient", "ratio"}}}]}

``ratio`` is tritonshm's median requests/s over tritonclient's (the better
tc method of the pair), from the same run and size: above 1 is more.
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from .._transport import GRPC, GRPC_AIO, HTTP_AIO
from ..demo import _size
from ..errors import Error
from ._harness import (DEFAULT_WARMUP, WrongOutput, close_all, method_classes, output_problem, round_order, run_meta,
                       sample_input, server_version)
from ._methods import INPUT, NO_GRPC, NO_HTTP, OUTPUT, Setting, _grpc_client
from ._report import server_at
from ._where import resolve

#: Identifies the layout of the results (and of ``--json``'s file) of ``bench --concurrency``.
CONCURRENCY_FORMAT = "tritonshm-bench-concurrency/1"

MODEL = "identity_fp32"

#: 4 KiB and 1 MiB.
CONCURRENCY_SIZES = (4 << 10, 1 << 20)

#: Seconds each measurement runs; rounds of measurements; a warm-up measurement's seconds at most.
DEFAULT_DURATION, DEFAULT_ROUNDS, WARMUP_DURATION = 1.0, 5, 0.3

#: Outputs up to this many bytes are all checked; larger ones one request in CHECK_STRIDE per caller.
CHECK_ALL_BYTES, CHECK_STRIDE = 64 << 10, 7

#: Seconds a measurement may overrun its duration before the bench gives up (one request stuck).
STUCK = 120.0


class ConcurrentMethod:
    """A way for N callers to share one client; subclasses fill in open/call/close.

    :meth:`call` (*caller*, *x*) is one request of caller *caller* and must
    be safe to run from N callers at once; the asyncio methods define
    ``acall`` instead and run on the method's own event loop.
    """

    name = ""
    group = ""   # "peer" or "tritonshm"
    mode = ""    # "threads" or "asyncio"
    description = ""
    needs_http = False  # talks to the server's HTTP address (left out without one)

    def __init__(self, setting: Setting, concurrency: int):
        self.setting = setting
        self.concurrency = concurrency

    @property
    def key(self) -> str:
        return self.name

    @classmethod
    def missing(cls) -> str | None:
        return None

    def open(self) -> None:
        """Once per size, untimed: the one shared client, per-caller regions."""

    def close(self) -> None:
        """Undo :meth:`open`; must cope with an ``open`` that failed halfway.  By default: close
        ``self.client`` if ``open`` made one."""
        client = getattr(self, "client", None)
        if client is not None:
            client.close()

    def measure(self, inputs: list[list[np.ndarray]], duration: float, stride: int,
                check: Callable[[Any, np.ndarray], str | None]) -> dict[str, Any]:
        """Every caller sends its inputs in turn for *duration* seconds (at least one request each);
        returns ``{"requests", "checked", "seconds"}``; :class:`WrongOutput` on a wrong output."""
        raise NotImplementedError


class _Tally:
    """What the callers of one measurement share: the first problem, the counts, the last end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.problem: str | None = None
        self.failure: BaseException | None = None
        self.requests = self.checked = 0
        self.last = 0.0

    def add(self, requests: int, checked: int, last: float) -> None:
        with self.lock:
            self.requests += requests
            self.checked += checked
            self.last = max(self.last, last)

    def result(self, start: float) -> dict[str, Any]:
        if self.failure is not None:
            raise self.failure
        if self.problem is not None:
            raise WrongOutput(self.problem)
        return {"requests": self.requests, "checked": self.checked, "seconds": self.last - start}


def _verdict(out: Any, x: np.ndarray, i: int, stride: int, check: Callable[[Any, np.ndarray], str | None]) \
        -> tuple[str | None, bool]:
    """(what is wrong with *out*, whether its contents were compared): dtype and shape always,
    the contents when *i* is a multiple of *stride*."""
    if i % stride == 0:
        return check(out, x), True
    if not isinstance(out, np.ndarray) or out.dtype != x.dtype or out.shape != x.shape:
        return check(out, x), True
    return None, False


class ThreadedMethod(ConcurrentMethod):
    mode = "threads"

    def call(self, caller: int, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def measure(self, inputs, duration, stride, check):
        tally = _Tally()
        stop = threading.Event()
        barrier = threading.Barrier(len(inputs) + 1)
        deadline = [0.0]

        def work(caller: int) -> None:
            mine = inputs[caller]
            requests = checked = 0
            last = 0.0
            try:
                barrier.wait()
                end = deadline[0]
                i = 0
                while not stop.is_set():
                    x = mine[i % len(mine)]
                    out = self.call(caller, x)
                    last = time.perf_counter()
                    problem, compared = _verdict(out, x, i, stride, check)
                    del out
                    requests += 1
                    checked += compared
                    if problem is not None:
                        with tally.lock:
                            tally.problem = tally.problem or problem
                        stop.set()
                    i += 1
                    if last >= end:
                        break
            except BaseException as exc:  # noqa: BLE001 -- handed to the measuring thread
                with tally.lock:
                    tally.failure = tally.failure or exc
                stop.set()
            finally:
                tally.add(requests, checked, last)

        threads = [threading.Thread(target=work, args=(c,), daemon=True, name=f"bench-caller-{c}")
                   for c in range(len(inputs))]
        for t in threads:
            t.start()
        start = time.perf_counter()
        deadline[0] = start + duration
        barrier.wait()
        for t in threads:
            t.join(duration + STUCK)
            if t.is_alive():
                stop.set()
                raise Error(f"{self.name}: a caller is still waiting for a response {STUCK:g} s after the end")
        return tally.result(start)


class AsyncMethod(ConcurrentMethod):
    mode = "asyncio"

    async def aopen(self) -> None:
        pass

    async def aclose(self) -> None:
        """Undo :meth:`aopen`, on the method's loop.  By default: close ``self.client`` if one was made."""
        client = getattr(self, "client", None)
        if client is not None:
            await client.close()

    async def acall(self, caller: int, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def open(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.aopen())

    def close(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is None:
            return
        try:
            loop.run_until_complete(self.aclose())
        finally:
            loop.close()

    def measure(self, inputs, duration, stride, check):
        return self.loop.run_until_complete(asyncio.wait_for(self._measure(inputs, duration, stride, check),
                                                             duration + STUCK))

    async def _measure(self, inputs, duration, stride, check):
        tally = _Tally()
        start = time.perf_counter()
        end = start + duration

        async def work(caller: int) -> None:
            mine = inputs[caller]
            requests = checked = 0
            last = 0.0
            try:
                i = 0
                while tally.problem is None:
                    x = mine[i % len(mine)]
                    out = await self.acall(caller, x)
                    last = time.perf_counter()
                    problem, compared = _verdict(out, x, i, stride, check)
                    del out
                    requests += 1
                    checked += compared
                    if problem is not None:
                        tally.problem = tally.problem or problem
                    i += 1
                    if last >= end:
                        break
            finally:
                tally.add(requests, checked, last)

        await asyncio.gather(*(work(c) for c in range(len(inputs))))
        return tally.result(start)


# -- the methods --------------------------------------------------------------------------------------


class TcGrpcThreads(ThreadedMethod):
    name = "tc-grpc-threads"
    group = "peer"
    description = ("N threads sharing one tritonclient.grpc.InferenceServerClient: plain gRPC, "
                   "the tensor inside the request and the reply")

    def open(self) -> None:
        self.client = _grpc_client(self.setting.require_grpc())

    def call(self, caller: int, x: np.ndarray) -> np.ndarray:
        inputs, outputs = self.setting.wire_args(x, GRPC)
        return self.client.infer(self.setting.model, inputs, outputs=outputs).as_numpy(OUTPUT)


class TcShmThreads(ThreadedMethod):
    name = "tc-shm-threads"
    group = "peer"
    description = ("N threads sharing one tritonclient.grpc.InferenceServerClient with tritonclient's "
                   "system shared-memory utilities: an input and an output region per thread, made and "
                   "registered once; per request set_shared_memory_region in, get_contents_as_numpy(...).copy() out")

    def open(self) -> None:
        import tritonclient.utils.shared_memory as tcshm

        s = self.setting
        tag = f"tc-conc-{os.getpid()}-{secrets.token_hex(4)}"
        self.created: list[Any] = []           # every region made, for close()
        self.handles: list[tuple[Any, Any]] = []
        self.names: list[tuple[str, str]] = []
        self.registered: list[str] = []
        self.client = _grpc_client(s.require_grpc())
        for caller in range(self.concurrency):
            names = (f"{tag}-{caller}-in", f"{tag}-{caller}-out")
            handles = []
            for name in names:
                handles.append(tcshm.create_shared_memory_region(name, "/" + name, s.nbytes))
                self.created.append(handles[-1])
                self.client.register_system_shared_memory(name, "/" + name, s.nbytes)
                self.registered.append(name)
            self.handles.append((handles[0], handles[1]))
            self.names.append(names)

    def call(self, caller: int, x: np.ndarray) -> np.ndarray:
        import tritonclient.grpc as grpcclient
        import tritonclient.utils.shared_memory as tcshm

        s = self.setting
        region_in, region_out = self.handles[caller]
        name_in, name_out = self.names[caller]
        tcshm.set_shared_memory_region(region_in, [x])
        infer_input = grpcclient.InferInput(INPUT, [s.count], s.datatype)
        infer_input.set_shared_memory(name_in, s.nbytes)
        requested = grpcclient.InferRequestedOutput(OUTPUT)
        requested.set_shared_memory(name_out, s.nbytes)
        self.client.infer(s.model, [infer_input], outputs=[requested])
        return tcshm.get_contents_as_numpy(region_out, s.dtype, [s.count]).copy()

    def close(self) -> None:
        import tritonclient.utils.shared_memory as tcshm

        client = getattr(self, "client", None)
        try:
            for name in getattr(self, "registered", ()):
                client.unregister_system_shared_memory(name)
        finally:
            for handle in getattr(self, "created", ()):
                tcshm.destroy_shared_memory_region(handle)
            if client is not None:
                client.close()


class ClientThreads(ThreadedMethod):
    name = "Client-threads"
    group = "tritonshm"
    description = ("N threads sharing one tritonshm.Client(url, transport='shm', slots=N): "
                   "infer(model, {name: x}), copy in, copy out")

    def open(self) -> None:
        from ..client import Client

        self.client = Client(self.setting.client_url(self.needs_http), transport="shm", slots=self.concurrency)

    def call(self, caller: int, x: np.ndarray) -> np.ndarray:
        return self.client.infer(self.setting.model, {INPUT: x})[OUTPUT]


class ClientHttpThreads(ClientThreads):
    name = "Client-http-threads"
    description = "the same, the client made with the server's http:// URL"
    needs_http = True


class TcGrpcAio(AsyncMethod):
    name = "tc-grpc-aio"
    group = "peer"
    description = ("N asyncio tasks sharing one tritonclient.grpc.aio.InferenceServerClient: plain gRPC, "
                   "the tensor inside the request and the reply")

    async def aopen(self) -> None:
        import tritonclient.grpc.aio as aiogrpc

        self.client = aiogrpc.InferenceServerClient(self.setting.require_grpc())

    async def acall(self, caller: int, x: np.ndarray) -> np.ndarray:
        inputs, outputs = self.setting.wire_args(x, GRPC_AIO)
        result = await self.client.infer(self.setting.model, inputs, outputs=outputs)
        return result.as_numpy(OUTPUT)


class TcHttpAio(AsyncMethod):
    name = "tc-http-aio"
    group = "peer"
    description = ("N asyncio tasks sharing one tritonclient.http.aio.InferenceServerClient: plain HTTP, "
                   "the tensor inside the request and the reply as binary data")
    needs_http = True

    async def aopen(self) -> None:
        import tritonclient.http.aio as aiohttp

        self.client = aiohttp.InferenceServerClient(self.setting.require_http(), conn_limit=self.concurrency)

    async def acall(self, caller: int, x: np.ndarray) -> np.ndarray:
        inputs, outputs = self.setting.wire_args(x, HTTP_AIO)
        result = await self.client.infer(self.setting.model, inputs, outputs=outputs)
        return result.as_numpy(OUTPUT)


class ClientAio(AsyncMethod):
    name = "Client-aio"
    group = "tritonshm"
    description = ("N asyncio tasks sharing one tritonshm.aio.Client(url, transport='shm', slots=N): "
                   "await infer(model, {name: x}), copy in, copy out")

    async def aopen(self) -> None:
        from ..aio import Client

        self.client = Client(self.setting.client_url(self.needs_http), transport="shm", slots=self.concurrency)

    async def acall(self, caller: int, x: np.ndarray) -> np.ndarray:
        return (await self.client.infer(self.setting.model, {INPUT: x}))[OUTPUT]


class ClientHttpAio(ClientAio):
    name = "Client-http-aio"
    description = "the same, the client made with the server's http:// URL"
    needs_http = True


#: Every method, in the order of the table.
CONCURRENCY_METHODS: tuple[type[ConcurrentMethod], ...] = (TcGrpcThreads, TcShmThreads, ClientThreads,
                                                            ClientHttpThreads, TcGrpcAio, TcHttpAio, ClientAio,
                                                            ClientHttpAio)
MODES = ("threads", "asyncio")


def check_concurrency(concurrency: Any, duration: Any, rounds: Any, warmup: Any) -> None:
    """ValueError, with a message for the command line, for arguments :func:`run_concurrency` refuses."""
    def count(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int)

    if not count(concurrency) or concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration > 0:
        raise ValueError(f"duration must be a number of seconds > 0, not {duration!r}")
    if not count(rounds) or rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds!r}")
    if not count(warmup) or warmup < 1:
        raise ValueError(f"warmup must be at least 1 (the first warm-up round starts every client), not {warmup!r}")


def _inputs(count: int, callers: int, seed: int, per_caller: int) -> list[list[np.ndarray]]:
    f32 = np.dtype(np.float32)
    return [[sample_input(f32, count, seed * 1_000_003 + caller * 17 + k) for k in range(per_caller)]
            for caller in range(callers)]


def _measure_size(setting: Setting, classes: Sequence[type[ConcurrentMethod]], concurrency: int, *,
                  duration: float, rounds: int, warmup: int, seed: int) -> dict[str, Any]:
    nbytes = setting.nbytes
    stride = 1 if nbytes <= CHECK_ALL_BYTES else CHECK_STRIDE
    inputs = _inputs(setting.count, concurrency, seed, 2)
    probe = _inputs(setting.count, concurrency, seed + 500_009, 1)
    samples: dict[str, list[dict[str, Any]]] = {c.name: [] for c in classes}
    methods = [c(setting, concurrency) for c in classes]
    opened: list[ConcurrentMethod] = []

    def check_for(method: ConcurrentMethod) -> Callable[[Any, np.ndarray], str | None]:
        return lambda out, x: output_problem(method.name, nbytes, out, x)

    failed = True
    try:
        for method in methods:
            opened.append(method)
            method.open()
        for index in range(warmup):
            for method in round_order(methods, index):
                method.measure(inputs, min(duration, WARMUP_DURATION), 1, check_for(method))
        for index in range(rounds):
            for method in round_order(methods, index):
                gc.collect(1)
                samples[method.name].append(method.measure(inputs, duration, stride, check_for(method)))
        # A fresh input per caller, never sent before, every output checked: a stale answer cannot pass.
        for method in methods:
            method.measure(probe, 0.0, 1, check_for(method))
        failed = False
    finally:
        close_all(opened, failed)
    return {"samples": samples, "stride": stride}


def _stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["requests"] / r["seconds"] for r in runs]
    p25, p50, p75 = np.percentile(rates, [25, 50, 75])
    return {"status": "ok", "requests_per_s": rates, "median_requests_per_s": float(p50),
            "p25_requests_per_s": float(p25), "p75_requests_per_s": float(p75),
            "requests": [r["requests"] for r in runs], "checked": [r["checked"] for r in runs],
            "seconds": [r["seconds"] for r in runs]}


def _pairs(classes: Sequence[type[ConcurrentMethod]]) -> dict[str, dict[str, Any]]:
    out = {}
    for mode in MODES:
        ours = [c.name for c in classes if c.mode == mode and c.group == "tritonshm"]
        theirs = [c.name for c in classes if c.mode == mode and c.group == "peer"]
        out[mode] = {"tritonshm": ours[0] if ours else None, "tritonclient": theirs, "ours": ours}
    return out


def _ratios(entry: dict[str, Any], pairs: dict[str, dict[str, Any]]) -> None:
    methods = entry["methods"]

    def rate(name: str | None) -> float | None:
        res = methods.get(name) if name else None
        return res["median_requests_per_s"] if res and res["status"] == "ok" else None

    entry["ratios"] = {}
    for mode, pair in pairs.items():
        peers = {p: rate(p) for p in pair["tritonclient"] if rate(p) is not None}
        best = max(peers, key=peers.__getitem__) if peers else None
        ours = rate(pair["tritonshm"])
        each = {name: rate(name) / peers[best] for name in pair["ours"] if rate(name) is not None and best}
        entry["ratios"][mode] = {"tritonshm": pair["tritonshm"] if ours is not None else None,
                                 "tritonclient": best,
                                 "ratio": ours / peers[best] if ours is not None and best else None,
                                 "each": each}


def run_concurrency(url: str | None, sizes: Sequence[int] = CONCURRENCY_SIZES, *, concurrency: int,
                    duration: float = DEFAULT_DURATION, rounds: int = DEFAULT_ROUNDS, warmup: int = DEFAULT_WARMUP,
                    methods: Sequence[type[ConcurrentMethod]] | None = None, seed: int = 0,
                    progress: Callable[[str], None] | None = None, server: str = "given",
                    http_url: str | None = None) -> dict[str, Any]:
    """Requests/s of *concurrency* callers sharing one client, every method at every size, against
    the server at *url* (gRPC host:port), which must serve ``identity_fp32``; the HTTP methods
    talk to its *http_url* (HTTP host:port) and are left out without one.

    *rounds* interleaved measurements of *duration* seconds each per method
    and size, after *warmup* short ones; :class:`WrongOutput` if an output
    checked is wrong (see the module's docstring for what is checked).
    Returns the results as plain data (what ``--json`` writes).
    """
    check_concurrency(concurrency, duration, rounds, warmup)
    if not sizes:
        raise ValueError("no sizes given")
    for nbytes in sizes:
        if nbytes <= 0 or nbytes % 4:
            raise ValueError(f"size {nbytes} is not a positive multiple of FP32's 4 bytes")
    where = resolve(url, http_url)
    url, http_url = where.grpc, where.http
    classes, missing, runnable = method_classes(CONCURRENCY_METHODS if methods is None else methods)
    for c in classes:  # a protocol without an address: its methods sit out, saying why
        unaddressed = NO_HTTP if c.needs_http and http_url is None else NO_GRPC if not c.needs_http and url is None else None
        if unaddressed is not None and missing[c.name] is None:
            missing[c.name] = unaddressed
    runnable = [c for c in runnable if missing[c.name] is None]
    version = server_version(where, MODEL)
    pairs = _pairs(classes)

    results = []
    for index, nbytes in enumerate(sizes):
        count = nbytes // 4
        setting = Setting(url=url, model=MODEL, datatype="FP32", dtype=np.dtype(np.float32), count=count,
                          http_url=http_url)
        started = time.perf_counter()
        measured = _measure_size(setting, runnable, concurrency, duration=duration, rounds=rounds,
                                 warmup=warmup, seed=seed + index)
        entry: dict[str, Any] = {"nbytes": nbytes, "elements": count, "rounds": rounds,
                                 "seconds": time.perf_counter() - started, "checked_every": measured["stride"],
                                 "methods": {}}
        for c in classes:
            if missing[c.name] is not None:
                entry["methods"][c.name] = {"status": missing[c.name]}
            else:
                entry["methods"][c.name] = _stats(measured["samples"][c.name])
        _ratios(entry, pairs)
        results.append(entry)
        if progress is not None:
            checked = ("every output checked" if measured["stride"] == 1 else
                       f"outputs checked: 1 in {measured['stride']} per caller (dtype and shape of all)")
            progress(f"{_size(nbytes)}: {rounds} rounds in {entry['seconds']:.1f} s, {checked}")

    meta = {
        "model": MODEL,
        "datatype": "FP32",
        "concurrency": concurrency,
        "duration_s": duration,
        "rounds": rounds,
        **run_meta(sizes, [{"reps": rounds} for _ in results], reps=rounds, min_reps=rounds, max_reps=rounds,
                   budget=duration, warmup=warmup, url=url, server=server, server_version=version,
                   http_url=http_url),
        "methods": {c.name: {"group": c.group, "mode": c.mode, "description": c.description,
                             "status": missing[c.name] or "ok"} for c in classes},
        "pairs": pairs,
        "checks": (f"every caller alternates two inputs of its own; dtype and shape of every output; contents bit "
                   f"for bit of every output up to {CHECK_ALL_BYTES} bytes, above that of one request in "
                   f"{CHECK_STRIDE} per caller; a last pass with a fresh input per caller, all checked"),
        "ratios": "tritonshm's median requests/s over the better tritonclient method's of the same mode and size: "
                  "above 1 = more",
    }
    for key in ("reps_requested", "min_reps", "max_reps", "budget_s", "reps"):
        meta.pop(key, None)
    return {"format": CONCURRENCY_FORMAT, "meta": meta, "results": results}


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def format_concurrency_table(results: dict[str, Any]) -> str:
    """``bench --concurrency``'s results as a readable table, one block per size."""
    meta = results["meta"]
    n = meta["concurrency"]
    lines = [
        f"{meta['model']} ({meta['datatype']}), {n} concurrent callers on one client; {server_at(meta)}",
        f"tritonshm {meta['tritonshm_version']}, {meta['cpu_count']} CPUs; {meta['rounds']} rounds of "
        f"{meta['duration_s']:g} s per method, interleaved (an order drawn anew each round)",
        "req/s: median over rounds (p25-p75); ratio: tritonshm over the better tritonclient method of its mode "
        "(above 1 = more)",
    ]
    width = 19
    header = f"  {'method':<{width}} {'mode':<8} {'req/s':>9} {'p25 - p75':>19} {'checked':>9} {'ratio':>6}"
    for entry in results["results"]:
        nbytes = entry["nbytes"]
        checks = ("every output checked" if entry["checked_every"] == 1 else
                  f"contents of 1 output in {entry['checked_every']} per caller checked, dtype and shape of all")
        lines += ["", f"{_size(nbytes)} ({entry['elements']} x {meta['datatype']}), {entry['rounds']} rounds; "
                      f"{checks}", header]
        ratios = entry["ratios"]
        for name, res in entry["methods"].items():
            mode = meta["methods"][name]["mode"]
            if res["status"] != "ok":
                lines.append(f"  {name:<{width}} {mode:<8} {res['status']}")
                continue
            pair = ratios.get(mode, {})
            each = pair.get("each", {})
            ratio = _ratio(each[name]) if name in each else (
                "1.00" if name == pair.get("tritonclient") and each else "")
            spread = f"{res['p25_requests_per_s']:.0f} - {res['p75_requests_per_s']:.0f}"
            lines.append(f"  {name:<{width}} {mode:<8} {res['median_requests_per_s']:>9.0f} {spread:>19} "
                         f"{sum(res['checked']):>9} {ratio:>6}")
    return "\n".join(lines)


def concurrency_description() -> str:
    """The ``--concurrency`` part of ``tritonshm bench --help``."""
    import textwrap

    lines = [f"With --concurrency N: requests/s of N callers sharing one client on {MODEL}, each measurement "
             "--duration", "seconds, --reps rounds interleaved; tritonshm over the better tritonclient method of "
             "the same mode. Methods:", ""]
    for m in CONCURRENCY_METHODS:
        lines += textwrap.wrap(m.description, 100, initial_indent=f"  {m.name:<18} ", subsequent_indent=" " * 21)
    return "\n".join(lines) + "\n"


__all__ = ["CONCURRENCY_FORMAT", "CONCURRENCY_SIZES", "CONCURRENCY_METHODS", "DEFAULT_DURATION", "DEFAULT_ROUNDS",
           "ConcurrentMethod", "ThreadedMethod", "AsyncMethod", "run_concurrency", "format_concurrency_table",
           "concurrency_description", "check_concurrency"]
