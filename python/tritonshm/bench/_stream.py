"""``tritonshm bench --stream``: one streamed request to a decoupled model, two ways, side by side.

The model is the bundled ``stream_fp32``: one request (INPUT0, a 1-D FP32
tensor of the given size, and COUNT) gets COUNT responses, response i
carrying OUTPUT0 = INPUT0 + i and INDEX = [i], then an empty final
response.  Each repetition sends one request and reads it to its final
response, timing two things from the call:

* TTFT, time to the first response: until its outputs are numpy arrays in
  the caller's hands;
* total, time to the final response (the whole request); responses/s is
  COUNT over its median.

Methods (each keeps one stream open for the whole size, so neither pays
for opening a stream per request):

* ``grpc-stream``, the baseline: tritonclient.grpc's own streaming,
  ``start_stream(callback)`` once, per request ``async_stream_infer(...,
  enable_empty_final_response=True)``; the tensors travel inside the
  messages; the callback queues each response and the caller takes them
  from the queue, ``as_numpy`` of both outputs, until the final one;
* ``Client.stream``: ``tritonshm.Client(url, transport="shm").stream(model,
  inputs)``, iterated to its end: the inputs go through a slot (shared
  memory), the outputs travel in the responses (as they must: Triton writes
  every response of a request into the same output region without waiting
  for a reader).

Repetitions are interleaved as in ``tritonshm bench`` (every method once per
round, in an order drawn anew each round; warm-up rounds first), and
every response of every call -- the warm-up, every timed repetition and a
last round with an input never sent before -- is checked, untimed, after
the call: COUNT responses, INDEX = [i], OUTPUT0 = INPUT0 + i bit for bit.
Streams are always read to their final response and never cancelled
(Triton < 2.57 has gRPC stream-cancellation races that can abort the server).

Results (what ``--json`` writes)::

    {"format": "tritonshm-bench-stream/1",
     "meta": {model, datatype, responses (per request), sizes, reps, baseline, server_version,
              tritonshm_version, cpu_count, versions, methods {name: {group, description, status}}, ...},
     "results": [{"nbytes", "elements", "responses", "reps", "seconds",
                  "methods": {name: {"status": "ok",
                                     "ttft": {"samples_s", "median_s", "p10_s", ..., "max_s"},
                                     "total": {... the same, to the final response},
                                     "responses_per_s",
                                     "ttft_vs_baseline", "total_vs_baseline",
                                     "responses_per_s_vs_baseline"}}}]}

The ratios are over the baseline of the same run and size: TTFT and total
are time ratios (below 1: sooner), responses/s a rate ratio (above 1: more).
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..demo import _size
from ..errors import Error
from ._harness import (DEFAULT_BUDGET, DEFAULT_MAX_REPS, DEFAULT_MIN_REPS, DEFAULT_WARMUP, check_arguments,
                       interleave, method_classes, output_problem, run_meta, sample_input, server_version,
                       summarize)
from ._methods import INPUT, OUTPUT, Method, Setting, _grpc_client
from ._report import server_note
from ._where import Addresses, require_grpc, resolve

#: Identifies the layout of the results (and of ``--json``'s file) of ``bench --stream``.
STREAM_FORMAT = "tritonshm-bench-stream/1"

#: The bundled decoupled model, its other input and output.
STREAM_MODEL, COUNT, INDEX = "stream_fp32", "COUNT", "INDEX"

#: 4 KiB, 1 MiB, 16 MiB (of INPUT0, and of each response's OUTPUT0).
STREAM_SIZES = (4 << 10, 1 << 20, 16 << 20)

#: Responses per request (the model's COUNT).
DEFAULT_RESPONSES = 16

#: The method the others are compared with.
BASELINE = "grpc-stream"

#: Seconds the bench waits for the next response of a request before it gives up (the run fails).
RESPONSE_WAIT = 120.0

FINAL = "triton_final_response"


@dataclasses.dataclass(frozen=True)
class StreamSetting(Setting):
    """A :class:`Setting` and the number of responses each request asks for (COUNT)."""

    responses: int = DEFAULT_RESPONSES

    @classmethod
    def of(cls, url: str, count: int, responses: int) -> "StreamSetting":
        return cls(url=url, model=STREAM_MODEL, datatype="FP32", dtype=np.dtype(np.float32), count=count,
                   responses=responses)


class Responses(list):
    """One streamed request's responses, in order: a dict of output arrays each.  *problem*:
    what the method saw wrong on the wire while reading them (None)."""

    problem: str | None = None


class StreamMethod(Method):
    """A way of sending one streamed request and reading it to its final response.

    :meth:`call` returns :class:`Responses` and notes in ``first_at`` the
    ``time.perf_counter()`` at which the first response's outputs were in
    hand; :meth:`sample` makes that the pair (seconds to the first
    response, seconds to the final one).
    """

    first_at: float | None = None

    def open(self) -> None:
        self.counts = np.array([self.setting.responses], dtype=np.int32)

    def sample(self, t0: float, t1: float) -> tuple[float, float]:
        assert self.first_at is not None  # the check saw at least one response
        return (self.first_at - t0, t1 - t0)


class TritonclientStream(StreamMethod):
    name = BASELINE
    group = "peer"
    description = ("tritonclient.grpc's streaming: start_stream(callback) once, per request "
                   "async_stream_infer(..., enable_empty_final_response=True), tensors in the messages; "
                   "the callback queues each response, the caller takes them with as_numpy until the final one")

    def open(self) -> None:
        super().open()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.ids = itertools.count()
        self.client = _grpc_client(self.setting.require_grpc())
        self.client.start_stream(self._callback)

    def _callback(self, result: Any, error: Any) -> None:
        self.inbox.put((result, error))

    def call(self, x: np.ndarray) -> Responses:
        import tritonclient.grpc as grpcclient

        s = self.setting
        self.first_at = None
        request_id = str(next(self.ids))
        data = grpcclient.InferInput(INPUT, [s.count], s.datatype)
        data.set_data_from_numpy(x)
        count = grpcclient.InferInput(COUNT, [1], "INT32")
        count.set_data_from_numpy(self.counts)
        outputs = [grpcclient.InferRequestedOutput(OUTPUT), grpcclient.InferRequestedOutput(INDEX)]
        self.client.async_stream_infer(s.model, [data, count], outputs=outputs, request_id=request_id,
                                       enable_empty_final_response=True)
        out = Responses()
        while True:
            try:
                result, error = self.inbox.get(timeout=RESPONSE_WAIT)
            except queue.Empty:
                raise Error(f"{self.name}: no response from the server within {RESPONSE_WAIT:g} s") from None
            if error is not None:
                # (the request may still run: closing the stream later half-closes it, never cancels)
                raise Error(f"{self.name}: the server answered with an error: {error}")
            response = result.get_response()
            if response.id != request_id and out.problem is None:
                out.problem = f"a response to request {response.id!r} came while reading request {request_id!r}"
            if response.outputs:
                outputs_in_hand = {OUTPUT: result.as_numpy(OUTPUT), INDEX: result.as_numpy(INDEX)}
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                out.append(outputs_in_hand)
            if FINAL in response.parameters and response.parameters[FINAL].bool_param:
                return out

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            try:
                client.stop_stream()  # half-closes the stream: never cancels (see the module's docstring)
            finally:
                client.close()


class ClientStream(StreamMethod):
    name = "Client.stream"
    group = "tritonshm"
    description = ("tritonshm.Client(url, transport='shm').stream(model, {INPUT0: x, COUNT: n}) iterated to "
                   "its end: the inputs through a slot, the outputs in the responses")

    def open(self) -> None:
        from ..client import Client

        super().open()
        self.client = Client(self.setting.require_grpc(), transport="shm")

    def call(self, x: np.ndarray) -> Responses:
        self.first_at = None
        out = Responses()
        for response in self.client.stream(self.setting.model, {INPUT: x, COUNT: self.counts}):
            if self.first_at is None:
                self.first_at = time.perf_counter()
            out.append(response)
        return out


#: Every streaming method, in the order of the table.
STREAM_METHODS: tuple[type[StreamMethod], ...] = (TritonclientStream, ClientStream)


def stream_output_problem(method: str, nbytes: int, out: Any, x: np.ndarray, responses: int) -> str | None:
    """What is wrong with *out*, the responses of ``stream_fp32`` to INPUT0 = *x* and COUNT =
    *responses*; None if there are *responses* of them, response i holding INDEX = [i] and
    OUTPUT0 = INPUT0 + i bit for bit."""
    where = f"{method}, {_size(nbytes)}"
    if not isinstance(out, list):
        return f"{where}: the call returned {type(out).__name__}, not a list of responses"
    if getattr(out, "problem", None):
        return f"{where}: {out.problem}"
    if len(out) != responses:
        return f"{where}: {len(out)} responses to one request, not {responses} (its COUNT)"
    expected = np.empty_like(x)
    for i, response in enumerate(out):
        if not isinstance(response, dict) or set(response) != {OUTPUT, INDEX}:
            got = sorted(response) if isinstance(response, dict) else type(response).__name__
            return f"{where}: response {i} holds {got}, not {sorted([INDEX, OUTPUT])}"
        index = response[INDEX]
        if not (isinstance(index, np.ndarray) and index.dtype == np.int32 and index.shape == (1,)
                and int(index[0]) == i):
            return f"{where}: response {i}'s INDEX is {index!r}, not [{i}] (int32): responses out of order or lost"
        np.add(x, np.float32(i), out=expected)
        problem = output_problem(method, nbytes, response[OUTPUT], expected, what=f"response {i}'s OUTPUT0",
                                 like=f"INPUT0 + {i}")
        if problem is not None:
            return problem
    return None


def check_responses(responses: int) -> None:
    """ValueError, with a message for the command line, unless *responses* is a count >= 1."""
    if isinstance(responses, bool) or not isinstance(responses, int) or responses < 1:
        raise ValueError(f"responses must be at least 1 (the time to the first response needs one), "
                         f"not {responses!r}")


def _stream_ratios(entry: dict[str, Any]) -> None:
    """Add responses/s and the ratios to the baseline to one size's results."""
    methods = entry["methods"]
    for result in methods.values():
        if result["status"] == "ok":
            result["responses_per_s"] = entry["responses"] / result["total"]["median_s"]
    base = methods.get(BASELINE)
    ok = base is not None and base["status"] == "ok"
    for result in methods.values():
        if result["status"] != "ok":
            continue
        result["ttft_vs_baseline"] = result["ttft"]["median_s"] / base["ttft"]["median_s"] if ok else None
        result["total_vs_baseline"] = result["total"]["median_s"] / base["total"]["median_s"] if ok else None
        result["responses_per_s_vs_baseline"] = (result["responses_per_s"] / base["responses_per_s"]
                                                 if ok else None)


def _without_status(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "status"}


def run_stream(url: str | None, sizes: Sequence[int] = STREAM_SIZES, *, responses: int = DEFAULT_RESPONSES,
               reps: int | None = None, min_reps: int = DEFAULT_MIN_REPS, max_reps: int = DEFAULT_MAX_REPS,
               budget: float = DEFAULT_BUDGET, warmup: int = DEFAULT_WARMUP,
               methods: Sequence[type[StreamMethod]] | None = None, seed: int = 0,
               progress: Callable[[str], None] | None = None, server: str = "given") -> dict[str, Any]:
    """Measure every streaming method at every size against the server at *url* (gRPC host:port),
    which must serve ``stream_fp32``; *responses* per request.

    Repetitions as in :func:`~tritonshm.bench.run`; every response of every
    call is checked: :class:`~tritonshm.bench.WrongOutput` if one is wrong
    or missing.  Returns the results as plain data (what ``--json`` writes;
    the module's docstring gives the layout).
    """
    check_arguments(sizes, dtype="fp32", reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                    warmup=warmup)
    check_responses(responses)
    url = require_grpc(resolve(url, None), "--stream")
    classes, missing, runnable = method_classes(STREAM_METHODS if methods is None else methods)
    version = server_version(Addresses(url, None), STREAM_MODEL)
    f32 = np.dtype(np.float32)

    results = []
    for index, nbytes in enumerate(sizes):
        count = nbytes // f32.itemsize
        setting = StreamSetting.of(url, count, responses)
        started = time.perf_counter()

        def check(method: Method, out: Any, x: np.ndarray, nbytes: int = nbytes) -> str | None:
            return stream_output_problem(method.name, nbytes, out, x, responses)

        measured = interleave([cls(setting) for cls in runnable], sample_input(f32, count, seed + index),
                              sample_input(f32, count, seed + index + 1_000_003), check, reps=reps,
                              min_reps=min_reps, max_reps=max_reps, budget=budget, warmup=warmup,
                              check_every=True)
        entry: dict[str, Any] = {"nbytes": nbytes, "elements": count, "responses": responses,
                                 "reps": measured["reps"], "seconds": time.perf_counter() - started, "methods": {}}
        for c in classes:
            why = missing[c.name] or measured["unavailable"].get(c.name)
            if why is not None:
                entry["methods"][c.name] = {"status": why, "ttft": None, "total": None}
                continue
            samples = measured["times"][c.name]
            entry["methods"][c.name] = {
                "status": "ok",
                "ttft": _without_status(summarize([first for first, _ in samples])),
                "total": _without_status(summarize([total for _, total in samples])),
            }
        _stream_ratios(entry)
        results.append(entry)
        if progress is not None:
            progress(f"{_size(nbytes)}: {entry['reps']} repetitions in {entry['seconds']:.1f} s, "
                     f"every response checked")

    statuses = {c.name: missing[c.name] or "ok" for c in classes}
    for entry in results[:1]:
        for name, res in entry["methods"].items():
            if res["status"] != "ok":
                statuses[name] = res["status"]
    meta = {
        "model": STREAM_MODEL,
        "datatype": "FP32",
        "responses": responses,
        **run_meta(sizes, results, reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                   warmup=warmup, url=url, server=server, server_version=version),
        "methods": {c.name: {"group": c.group, "description": c.description, "status": statuses[c.name]}
                    for c in classes},
        "baseline": BASELINE,
        "measures": "ttft: seconds from the call to the first response's outputs in hand; total: to the final "
                    "response; responses_per_s: responses / total's median",
        "ratios": "over the baseline's, same size: ttft and total below 1 = sooner, responses_per_s above 1 = more",
    }
    return {"format": STREAM_FORMAT, "meta": meta, "results": results}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def format_stream_table(results: dict[str, Any]) -> str:
    """``bench --stream``'s results as a readable table, one block per size."""
    meta = results["meta"]
    base = meta["baseline"]
    lines = [
        f"{meta['model']} ({meta['datatype']}, decoupled), {meta['responses']} responses per request; "
        f"{server_note(meta)}",
        f"tritonshm {meta['tritonshm_version']}, {meta['cpu_count']} CPUs; repetitions interleaved: every method "
        f"once per round, in an order drawn anew each round; every response checked",
        "TTFT: ms from the call to the first response's outputs in hand; total: ms to the final response "
        "(median and p25-p75);",
        f"resp/s: responses / median total; ratios over {base} (TTFT and total below 1 = sooner, "
        f"resp/s above 1 = more)",
    ]
    width = 15
    header = (f"  {'method':<{width}} {'TTFT':>9} {'p25 - p75':>19} {'total':>9} {'p25 - p75':>21} "
              f"{'resp/s':>9} {'TTFT/':>7} {'total/':>7} {'resp/s/':>8}")
    for entry in results["results"]:
        nbytes = entry["nbytes"]
        lines += ["", f"{_size(nbytes)} ({entry['elements']} x {meta['datatype']}) in, {entry['responses']} "
                      f"responses of {_size(nbytes)} out, {entry['reps']} repetitions", header]
        for name, res in entry["methods"].items():
            if res["status"] != "ok":
                lines.append(f"  {name:<{width}} {res['status']}")
                continue
            ttft, total = res["ttft"], res["total"]
            lines.append(
                f"  {name:<{width}} {_ms(ttft['median_s']):>9} "
                f"{_ms(ttft['p25_s']) + ' - ' + _ms(ttft['p75_s']):>19} {_ms(total['median_s']):>9} "
                f"{_ms(total['p25_s']) + ' - ' + _ms(total['p75_s']):>21} {res['responses_per_s']:>9.1f} "
                f"{_ratio(res['ttft_vs_baseline']):>7} {_ratio(res['total_vs_baseline']):>7} "
                f"{_ratio(res['responses_per_s_vs_baseline']):>8}")
    return "\n".join(lines)


def stream_description() -> str:
    """The ``--stream`` part of ``tritonshm bench --help``."""
    import textwrap

    lines = [f"With --stream: one request to the decoupled {STREAM_MODEL} per repetition, answered with "
             f"--responses", "responses and read to the final one: the time to the first response (TTFT), to the "
             "final one,", f"and responses/s, as ratios over {BASELINE}'s; every response of every call is checked. "
             "Methods:", ""]
    for m in STREAM_METHODS:
        lines += textwrap.wrap(m.description, 100, initial_indent=f"  {m.name:<18} ", subsequent_indent=" " * 21)
    return "\n".join(lines) + "\n"


__all__ = ["STREAM_FORMAT", "STREAM_SIZES", "STREAM_METHODS", "STREAM_MODEL", "DEFAULT_RESPONSES", "BASELINE",
           "StreamMethod", "StreamSetting", "Responses", "run_stream", "format_stream_table", "stream_description",
           "stream_output_problem", "check_responses"]
