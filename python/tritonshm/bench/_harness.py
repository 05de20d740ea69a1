"""Interleaved repetitions, output checks and the statistics of ``tritonshm bench``."""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import os
import platform
import random
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..demo import _size
from ..errors import Error
from ._methods import AGAINST_LIMIT, LIMIT_PARTS, LIMITS, METHODS, MODELS, PEERS, Method, Setting, Unavailable
from ._where import resolve, server_version

#: Identifies the layout of the results (and of ``--json``'s file).  /2: the HTTP floor and limit
#: (``floor-http``, ``limit-http``), the HTTP rows' ``vs_limit`` over the HTTP limit (over the gRPC
#: one in /1), ``meta.http_url`` and ``meta.limits``.
FORMAT = "tritonshm-bench/2"

#: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB.
DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)

#: Without ``reps``: repetitions per size stop at ``max_reps``, or once
#: ``budget`` seconds are spent and at least ``min_reps`` are done.
DEFAULT_MIN_REPS, DEFAULT_MAX_REPS, DEFAULT_BUDGET = 10, 100, 10.0
DEFAULT_WARMUP = 2


class WrongOutput(Error, AssertionError):
    """A method's output differed from its input: its timings mean nothing."""


def sample_input(dtype: np.dtype, count: int, seed: int) -> np.ndarray:
    """*count* reproducible values of *dtype* (no NaN, so equality is exact)."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        return rng.standard_normal(count, dtype=dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)


def output_problem(method: str, nbytes: int, out: Any, expected: np.ndarray, *,
                   what: str | None = None, like: str | None = None) -> str | None:
    """What is wrong with *out*, the identity model's answer to *expected*; None if it is
    *expected* bit for bit.  *what* and *like* name the two in the message, for another
    model's output (say ``"response 3's OUTPUT0"`` and ``"INPUT0 + 3"``)."""
    where = f"{method}, {_size(nbytes)}"
    if not isinstance(out, np.ndarray) or out.dtype != expected.dtype or out.shape != expected.shape:
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        return (f"{where}: {what or 'the output'} is {got}, not {expected.dtype} {list(expected.shape)} "
                f"like {like or 'the input'}")
    if np.array_equal(out.reshape(-1).view(np.uint8), expected.reshape(-1).view(np.uint8)):
        return None
    got_bytes = out.reshape(-1).view(np.uint8).reshape(out.size, -1)
    sent_bytes = expected.reshape(-1).view(np.uint8).reshape(out.size, -1)
    wrong = np.flatnonzero((got_bytes != sent_bytes).any(axis=1))
    first = int(wrong[0])
    output, wanted = (what, "expected") if what else ("the identity model's output", "sent")
    return (f"{where}: {output} differs from {like or 'its input'} at {wrong.size} of {out.size} elements, "
            f"first at [{first}]: got {out.reshape(-1)[first]!r}, {wanted} {expected.reshape(-1)[first]!r}")


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median and spread of *samples* (seconds)."""
    a = np.asarray(samples, dtype=np.float64)
    p10, p25, p50, p75, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    return {
        "status": "ok",
        "samples_s": [float(s) for s in a],
        "median_s": float(p50),
        "p10_s": float(p10), "p25_s": float(p25), "p75_s": float(p75), "p90_s": float(p90),
        "iqr_s": float(p75 - p25),
        "min_s": float(a.min()), "max_s": float(a.max()),
    }


def round_order(items: Sequence[Any], index: int) -> list[Any]:
    """Round *index*'s order of *items*: a permutation drawn from *index* (the same each run).

    Over the rounds each item runs at every place, and after every other one, alike.  A rotation
    would keep each after the same neighbour round after round, and what one method leaves behind
    falls on the next: on an H200 the server answered the request that always followed
    tritonclient's CUDA row 0.1-0.2 ms slower than the same request after another row
    (bench/gpu_phases.py, 2026-11-28)."""
    order = list(items)
    random.Random(index).shuffle(order)
    return order


def _round(methods: list[Method], x: Any, index: int, *, check: Callable[[Method, Any, Any], str | None] | None,
           times: dict[str, list[float]] | None) -> None:
    """Round *index*: every method once on input *x*, in :func:`round_order`.

    With *check*, each output is given to it with *x* (untimed; it returns
    what is wrong, or None); with *times*, each call's sample (its seconds:
    :meth:`Method.sample`) is appended there, under the method's ``key``.
    """
    for method in round_order(methods, index):
        method.stage(x)
        t0 = time.perf_counter()
        out = method.call(x)
        t1 = time.perf_counter()
        problem = check(method, out, x) if check is not None else None
        del out  # a zero-copy view holds its slot until dropped
        if problem:
            raise WrongOutput(problem)
        if times is not None:
            times[method.key].append(method.sample(t0, t1))
    # Collect here, between rounds, rather than inside a timed call; the
    # young generations only: a full collection costs tens of ms.
    gc.collect(1)


def interleave(methods: Sequence[Method], data: Any, probe: Any, check: Callable[[Method, Any, Any], str | None], *,
               reps: int | None, min_reps: int, max_reps: int, budget: float, warmup: int,
               check_every: bool = False) -> dict[str, Any]:
    """Open *methods*, warm up and check on *data*, run interleaved rounds, check on *probe*, close them.

    With *check_every*, the outputs of the timed rounds are checked too
    (untimed, after each call).  A method whose ``open()`` raises
    :class:`Unavailable` is closed and left out.  Returns ``{"reps",
    "times": {key: [samples]}, "unavailable": {key: message}}`` (a sample
    is what :meth:`Method.sample` gives: seconds, by default).
    """
    opened: list[Method] = []
    times: dict[str, list[float]] = {}
    unavailable: dict[str, str] = {}
    gc_was_enabled = gc.isenabled()
    failed = True
    done = 0
    try:
        for method in methods:
            try:
                method.open()
            except Unavailable as exc:
                unavailable[method.key] = str(exc)
                method.close()
                continue
            finally:
                if method.key not in unavailable:
                    opened.append(method)
            times[method.key] = []
        if opened:
            # Warm-up: first-use costs (connections, pools, registration, page
            # faults) are not per-request costs.  Its first round checks outputs.
            for index in range(warmup):
                _round(opened, data, index, check=check if index == 0 else None, times=None)
            gc.disable()
            t0 = time.perf_counter()
            while True:
                if reps is not None:
                    if done >= reps:
                        break
                elif done >= max_reps or (done >= min_reps and time.perf_counter() - t0 >= budget):
                    break
                _round(opened, data, done, check=check if check_every else None, times=times)
                done += 1
            # A second input, never sent before: an output left over from an
            # earlier request cannot pass for the answer to it.
            _round(opened, probe, 0, check=check, times=None)
        failed = False
    finally:
        if gc_was_enabled:
            gc.enable()
        close_all(opened, failed)
    return {"reps": done, "times": times, "unavailable": unavailable}


def close_all(opened: Sequence[Any], failed: bool) -> None:
    """Close every method of *opened*, the last opened first; then raise the first failure to
    close -- unless the run itself *failed*, whose error says more and goes through."""
    errors = []
    for method in reversed(opened):
        try:
            method.close()
        except Exception as exc:  # close them all, then report the first
            errors.append(exc)
    gc.collect()
    if errors and not failed:
        raise errors[0]


def measure_size(url: str | None, model: str, datatype: str, dtype: np.dtype, nbytes: int,
                 classes: Sequence[type[Method]], *, reps: int | None, min_reps: int, max_reps: int,
                 budget: float, warmup: int, seed: int, http_url: str | None = None) -> dict[str, Any]:
    """One size: open every method, warm up and check, interleaved rounds, check again, close.
    *url* and *http_url* are the server's gRPC and HTTP ``host:port`` (None: that protocol's rows sit out)."""
    count = nbytes // dtype.itemsize
    setting = Setting(url=url, model=model, datatype=datatype, dtype=dtype, count=count, http_url=http_url)
    started = time.perf_counter()

    def check(method: Method, out: Any, x: np.ndarray) -> str | None:
        return output_problem(method.name, nbytes, out, x)

    measured = interleave([cls(setting) for cls in classes], sample_input(dtype, count, seed),
                          sample_input(dtype, count, seed + 1_000_003), check, reps=reps, min_reps=min_reps,
                          max_reps=max_reps, budget=budget, warmup=warmup)
    return {"nbytes": nbytes, "elements": count, "reps": measured["reps"],
            "seconds": time.perf_counter() - started, "times": measured["times"],
            "unavailable": measured["unavailable"]}


def _ratios(entry: dict[str, Any]) -> None:
    """Add the limits and each method's ratios to one size's results."""
    methods = entry["methods"]
    for limit, parts in LIMITS.items():
        if all(methods.get(p, {}).get("status") == "ok" for p in parts):
            methods[limit] = summarize([sum(s) for s in zip(*(methods[p]["samples_s"] for p in parts))])
            methods[limit]["of"] = list(parts)
    peers = {p: methods[p]["median_s"] for p in PEERS if methods.get(p, {}).get("status") == "ok"}
    best = min(peers, key=peers.__getitem__) if peers else None
    entry["best_peer"] = best
    for name, result in methods.items():
        if result.get("status") != "ok":
            continue
        result["vs_best_peer"] = result["median_s"] / peers[best] if best else None
        limit = methods.get(AGAINST_LIMIT.get(name, ""), {}).get("median_s")
        result["vs_limit"] = result["median_s"] / limit if limit else None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("tritonclient", "numpy", "triton-shm-client", "grpcio"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def check_arguments(sizes: Sequence[int], *, dtype: str, reps: int | None, min_reps: int, max_reps: int,
                    budget: float, warmup: int) -> None:
    """ValueError, with a message for the command line, for arguments :func:`run` refuses."""
    if dtype not in MODELS:
        raise ValueError(f"dtype must be one of {', '.join(MODELS)}, not {dtype!r}")
    _, datatype, np_dtype = MODELS[dtype]
    if not sizes:
        raise ValueError("no sizes given")
    for nbytes in sizes:
        if nbytes <= 0 or nbytes % np_dtype.itemsize:
            raise ValueError(f"size {nbytes} is not a positive multiple of {datatype}'s {np_dtype.itemsize} bytes")
    if reps is not None and reps < 1:
        raise ValueError(f"reps must be at least 1, not {reps}")
    if not 1 <= min_reps <= max_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, not {min_reps} and {max_reps}")
    if not budget >= 0:
        raise ValueError(f"budget must be a number of seconds >= 0, not {budget}")
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 (the first warm-up round checks the outputs), not {warmup}")


def method_classes(methods: Sequence[type[Method]]) -> tuple[list[type[Method]], dict[str, str | None],
                                                         list[type[Method]]]:
    """*methods* as a list, why each cannot run here (None if it can), and those that can.
    ValueError if two share a name."""
    classes = list(methods)
    if len({c.name for c in classes}) != len(classes):
        raise ValueError("two methods share a name")
    missing = {c.name: c.missing() for c in classes}
    return classes, missing, [c for c in classes if missing[c.name] is None]


def run_meta(sizes: Sequence[int], results: list[dict[str, Any]], *, reps: int | None, min_reps: int,
             max_reps: int, budget: float, warmup: int, url: str | None, server: str, server_version: str,
             http_url: str | None = None) -> dict[str, Any]:
    """What the metadata of every bench run holds: the arguments, the server, the versions, this machine."""
    from .. import __version__

    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "sizes": list(sizes),
        "reps": [entry["reps"] for entry in results],
        "reps_requested": reps,
        "min_reps": min_reps, "max_reps": max_reps, "budget_s": budget, "warmup": warmup,
        "url": url,
        "http_url": http_url,
        "server": server,
        "server_version": server_version,
        "tritonshm_version": __version__,
        "versions": _versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run(url: str | None, sizes: Sequence[int] = DEFAULT_SIZES, *, dtype: str = "fp32", reps: int | None = None,
        min_reps: int = DEFAULT_MIN_REPS, max_reps: int = DEFAULT_MAX_REPS, budget: float = DEFAULT_BUDGET,
        warmup: int = DEFAULT_WARMUP, methods: Sequence[type[Method]] | None = None, seed: int = 0,
        progress: Callable[[str], None] | None = None, server: str = "given",
        http_url: str | None = None) -> dict[str, Any]:
    """Measure every method at every size against the server at *url*, its gRPC address (the
    HTTP methods at *http_url*, its HTTP address, and left out without it); *url* may instead be
    the server's ``http://`` URL, without *http_url*: the gRPC methods are then left out.  Both
    are read as :class:`~tritonshm.Client` reads a URL (:func:`~tritonshm.bench._where.resolve`).

    *reps* fixes the repetitions per size; without it they run until
    *max_reps*, or until *budget* seconds are spent and at least *min_reps*
    are done.  Every method's output is checked against its input in the
    first warm-up round and in a last, untimed round with a fresh input:
    :class:`WrongOutput` if any differs.  Returns the results as plain data
    (what ``--json`` writes; :mod:`tritonshm.bench` documents the layout).
    """
    check_arguments(sizes, dtype=dtype, reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                    warmup=warmup)
    where = resolve(url, http_url)
    model, datatype, np_dtype = MODELS[dtype]
    classes, missing, runnable = method_classes(METHODS if methods is None else methods)
    version = server_version(where, model)

    results = []
    for index, nbytes in enumerate(sizes):
        measured = measure_size(where.grpc, model, datatype, np_dtype, nbytes, runnable, reps=reps,
                                min_reps=min_reps, max_reps=max_reps, budget=budget, warmup=warmup,
                                seed=seed + index, http_url=where.http)
        entry = {key: measured[key] for key in ("nbytes", "elements", "reps", "seconds")}
        problems = {**missing, **measured["unavailable"]}
        entry["methods"] = {
            c.name: summarize(measured["times"][c.name]) if problems.get(c.name) is None
            else {"status": problems[c.name], "samples_s": []}
            for c in classes
        }
        _ratios(entry)
        results.append(entry)
        if progress is not None:
            progress(f"{_size(nbytes)}: {entry['reps']} repetitions in {entry['seconds']:.1f} s, outputs checked")

    meta = {
        "model": model,
        "datatype": datatype,
        **run_meta(sizes, results, reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                   warmup=warmup, url=where.grpc, server=server, server_version=version, http_url=where.http),
        "methods": {c.name: {"group": c.group, "description": c.description, "status": missing[c.name] or "ok"}
                    for c in classes},
        "limit": " + ".join(LIMIT_PARTS),
        "limits": {name: " + ".join(parts) for name, parts in LIMITS.items()},
        "against_limit": dict(AGAINST_LIMIT),
        "peers": [p for p in PEERS if p in missing],
        "ratios": "median time / the reference's median time (below 1: faster than the reference)",
    }
    return {"format": FORMAT, "meta": meta, "results": results}
