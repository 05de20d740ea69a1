"""``tritonshm bench``: one identity request, every way, side by side, in one run.

One server (a :class:`~tritonshm.server.LocalServer` started for the run, or
``--url``), one bundled identity model (``identity_fp32``, or
``identity_uint8`` with ``--dtype uint8``), one request per repetition with
a 1-D input of the given number of bytes.  The methods (see ``_methods.py``):

* peers, what tritonshm competes with: ``grpc`` and ``http`` (tensors
  inside the gRPC messages, or the HTTP bodies as binary data), ``tc-shm`` (tritonclient's ``shared_memory`` utilities, regions
  registered once, copy in and copy out per request), ``triton-shm-client``
  (PyPI ``triton-shm-client``, only where it is installed);
* tritonshm: ``Client.infer`` (copies in and out) and ``zero-copy``
  (``Client.request()``: the input written into the slot, the output read
  as a view of it), each also with ``-http``: the client made with the
  server's ``http://`` URL (left out under ``--url`` without ``--http-url``);
  ``tritonshm.grpc`` and ``tritonshm.http``: tritonclient's API via tritonshm,
  the ``grpc`` and ``http`` rows' very code with the facade module imported
  in place of tritonclient's (the tensors through its slots);
* references: ``floor`` (inputs already in a registered region, outputs
  left there: the tritonclient ``infer`` call alone) and ``memcpy`` (one
  copy of the input's bytes); ``limit = floor + memcpy``, repetition by
  repetition, is what a client that must take its input from the caller's
  array can at best reach.

Repetitions are interleaved: each round runs every method once, the order
rotating by one place per round, so the noise of a shared machine falls on
every method alike.  Warm-up rounds come first.  Every method's output is
checked against its input in the first warm-up round and in a last round
with an input never sent before (so a stale result cannot pass);
:class:`WrongOutput` stops the run.

Results (``run()``'s return value, and what ``--json`` writes)::

    {"format": "tritonshm-bench/1",
     "meta": {model, datatype, sizes, reps (per size), server_version, tritonshm_version,
              cpu_count, cpu_affinity, versions, methods {name: {group, description, status}},
              peers, limit, url, server ("started" | "given"), time_utc, ...},
     "results": [{"nbytes", "elements", "reps", "seconds", "best_peer",
                  "methods": {name: {"status": "ok" | "not installed", "samples_s": [...],
                                     "median_s", "p10_s", "p25_s", "p75_s", "p90_s", "iqr_s",
                                     "min_s", "max_s", "vs_best_peer", "vs_limit"}}}]}

Ratios are median time over the reference's median time: below 1 is
faster.  ``vs_limit`` is given for ``Client.infer`` and ``zero-copy`` (and their ``-http`` twins)
and for ``tritonshm.grpc`` / ``tritonshm.http``.

``tritonshm bench --gpu`` (:func:`run_gpu`, ``_gpu.py``) does the same from a
GPU tensor, against a GPU model and the CPU identity model side by side.

``tritonshm bench --stream`` (:func:`run_stream`, ``_stream.py``) sends one
request per repetition to the decoupled ``stream_fp32`` and reads its
``--responses`` responses: the time to the first response and responses/s of
``Client.stream`` against tritonclient's own streaming, over the same rounds.
It is a mode of its own rather than a section of the default run: its model,
sizes and methods are not the identity bench's (every response carries an
output as large as the input, so the default sizes up to 64 MiB would move a
GiB per request), and its ~20 s (4 KiB, 1 and 16 MiB) would make the default
run (~35 s) some 60% longer on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import Callable, Sequence

from ._gpu import (
    GPU_FORMAT,
    GPU_METHODS,
    GPU_SIZES,
    format_gpu_table,
    gpu_description,
    gpu_missing,
    gpu_model_repository,
    run_gpu,
    server_arguments,
)
from ._harness import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_REPS,
    DEFAULT_MIN_REPS,
    DEFAULT_SIZES,
    DEFAULT_WARMUP,
    FORMAT,
    Unavailable,
    WrongOutput,
    check_arguments,
    run,
)
from ._concurrency import (
    CONCURRENCY_FORMAT,
    CONCURRENCY_METHODS,
    CONCURRENCY_SIZES,
    DEFAULT_DURATION,
    DEFAULT_ROUNDS,
    check_concurrency,
    concurrency_description,
    format_concurrency_table,
    run_concurrency,
)
from ._methods import METHODS, MODELS, Method
from ._report import format_table, matplotlib_missing, write_json, write_plot
from ._stream import (
    DEFAULT_RESPONSES,
    STREAM_FORMAT,
    STREAM_METHODS,
    STREAM_SIZES,
    check_responses,
    format_stream_table,
    run_stream,
    stream_description,
)

__all__ = ["run", "run_bench", "add_arguments", "parse_size", "WrongOutput", "Unavailable", "Method", "METHODS",
           "DEFAULT_SIZES", "FORMAT", "format_table", "write_json", "write_plot",
           "run_gpu", "GPU_METHODS", "GPU_SIZES", "GPU_FORMAT", "format_gpu_table", "gpu_missing",
           "gpu_model_repository", "run_stream", "STREAM_METHODS", "STREAM_SIZES", "STREAM_FORMAT",
           "DEFAULT_RESPONSES", "format_stream_table", "run_concurrency", "CONCURRENCY_METHODS",
           "CONCURRENCY_SIZES", "CONCURRENCY_FORMAT", "format_concurrency_table"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"4K"``, ``"4KiB"``, ``"1M"``, ``"64MiB"``, ``"4096"`` -> bytes (K, M, G are powers of 1024)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4K, 64KiB, 1M, 16MiB, 4096)")
    return int(match.group(1)) * _UNITS[unit]


def _size_list(text: str) -> list[int]:
    """One ``--sizes`` word: a size, or several separated by commas."""
    return [parse_size(part) for part in text.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tritonshm bench``."""
    names = [m.name for m in METHODS]
    names += [m.name for m in GPU_METHODS if m.name not in names]
    names += [m.name for m in STREAM_METHODS]
    names += [m.name for m in CONCURRENCY_METHODS]
    parser.add_argument("--url", default=None, metavar="HOST:PORT",
                        help="gRPC address of a running Triton that serves tritonshm's bundled identity models "
                             "(default: start a local server for the run)")
    parser.add_argument("--http-url", default=None, metavar="HOST:PORT",
                        help="with --url: the same server's HTTP address, for the HTTP methods (left out "
                             "without it; a server the bench starts gives its own)")
    parser.add_argument("--sizes", nargs="+", type=_size_list, default=None, metavar="SIZE",
                        help="input sizes in bytes, K/M/G (or KiB/MiB/GiB) meaning powers of 1024, "
                             "space- or comma-separated (default: 4K 64K 1M 16M 64M; with --gpu 64K 1M 16M 64M; "
                             "with --stream 4K 1M 16M; with --concurrency 4K 1M)")
    parser.add_argument("--dtype", choices=sorted(MODELS), default="fp32",
                        help="input datatype: fp32 uses identity_fp32, uint8 identity_uint8 (default fp32; "
                             "--gpu is fp32 only)")
    parser.add_argument("--gpu", action="store_true",
                        help="from a GPU tensor (torch, cuda:0), result wanted on the GPU: the GPU methods "
                             "against identity_fp32_gpu and identity_fp32 side by side (needs CUDA, torch "
                             "with CUDA, and torch in the server's Python for the GPU model; see the README)")
    parser.add_argument("--stream", action="store_true",
                        help="streaming instead: one request per repetition to the decoupled stream_fp32, read to "
                             "its final response; time to the first response and responses/s of Client.stream "
                             "against tritonclient's own streaming (grpc-stream)")
    parser.add_argument("--responses", type=int, default=None, metavar="N",
                        help=f"with --stream: responses per request, the model's COUNT (default {DEFAULT_RESPONSES})")
    parser.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="concurrency instead: requests/s of N callers sharing one client on identity_fp32, "
                             "N threads (tritonshm.Client against tritonclient.grpc, plain and with shared memory) "
                             "and N asyncio tasks (tritonshm.aio.Client against tritonclient.grpc.aio)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help=f"with --concurrency: seconds each measurement runs (default {DEFAULT_DURATION:g}); "
                             f"--reps is then the number of rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument("--reps", type=int, default=None, metavar="N",
                        help="exactly N measured repetitions per size (default: as many as fit in --budget, "
                             "between --min-reps and --max-reps)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"without --reps: stop a size's repetitions after this long (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--min-reps", type=int, default=DEFAULT_MIN_REPS, metavar="N",
                        help=f"without --reps: at least N repetitions per size (default {DEFAULT_MIN_REPS})")
    parser.add_argument("--max-reps", type=int, default=DEFAULT_MAX_REPS, metavar="N",
                        help=f"without --reps: at most N repetitions per size (default {DEFAULT_MAX_REPS})")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
                        help=f"untimed rounds per size before measuring; the first checks every output "
                             f"(default {DEFAULT_WARMUP}, at least 1)")
    parser.add_argument("--methods", nargs="+", choices=names, default=None, metavar="METHOD",
                        help=f"only these methods, of: {', '.join(names)} (default: all; the limit "
                             "needs floor and memcpy, the ratios at least one peer; with --gpu: "
                             f"{', '.join(m.name for m in GPU_METHODS)}; with --stream: "
                             f"{', '.join(m.name for m in STREAM_METHODS)})")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write every sample, statistic and ratio, with the run's metadata, "
                             "as JSON to PATH ('-': standard output, the table then goes to standard error)")
    parser.add_argument("--plot", default=None, metavar="PATH.png",
                        help="also plot time per request and the ratio to the best peer against size "
                             "(needs matplotlib)")


def description() -> str:
    """The help text above the options: what each method does."""
    lines = ["One identity-model request per repetition, each method once per round (rotating order),",
             "median and p25-p75 per method and size, ratios to the best peer and to the limit;",
             "every output is checked against its input. Methods:", ""]
    for m in METHODS:
        lines += textwrap.wrap(m.description, 100, initial_indent=f"  {m.name:<18} ", subsequent_indent=" " * 21)
    lines += [f"  {'limit':<18} floor + memcpy, repetition by repetition", ""]
    return ("\n".join(lines) + "\n" + gpu_description() + "\n" + stream_description() + "\n"
            + concurrency_description())


def _fail(message: str, code: int = 2) -> int:
    print(f"tritonshm bench: {message}", file=sys.stderr)
    return code


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _measure_and_print(args: argparse.Namespace, measure: Callable[[str, str, str | None], dict],
                       format_results: Callable[[dict], str], starting: str,
                       server_args: Sequence[str] = ()) -> dict | None:
    """``measure(url, server, http_url)`` against ``--url`` (and ``--http-url``), or against a
    LocalServer (with *server_args*)
    started for it after printing *starting*; then the table (on stderr when ``--json -``) and
    ``--json``.  Returns the results, or None once a failure is printed."""
    from .. import errors

    table_out = sys.stderr if args.json == "-" else sys.stdout
    try:
        if args.url:
            results = measure(args.url, "given", args.http_url)
        else:
            from ..server import LocalServer

            print(starting, file=sys.stderr, flush=True)
            with LocalServer(extra_args=server_args) as server:
                results = measure(server.grpc_url, "started", server.http_url)
    except WrongOutput as exc:
        _fail(f"FAILED, wrong output: {exc}", code=1)
        return None
    except errors.Error as exc:
        _fail(f"FAILED: {exc}", code=1)
        return None
    print(format_results(results), file=table_out, flush=True)
    if args.json is not None:
        write_json(results, args.json)
    return results


def run_bench(args: argparse.Namespace) -> int:
    """``tritonshm bench``: measure, print the table, write --json / --plot."""
    if args.gpu and args.stream:
        return _fail("--gpu and --stream do not go together: one of them per run")
    if args.concurrency is not None and (args.gpu or args.stream):
        return _fail(f"--concurrency and --{'gpu' if args.gpu else 'stream'} do not go together: one of them per run")
    if args.responses is not None and not args.stream:
        return _fail("--responses: only with --stream")
    if args.duration is not None and args.concurrency is None:
        return _fail("--duration: only with --concurrency")
    if args.concurrency is not None:
        return _run_concurrency_bench(args)
    if args.gpu:
        return _run_gpu_bench(args)
    if args.stream:
        return _run_stream_bench(args)
    unknown = [name for name in args.methods or () if name not in {m.name for m in METHODS}]
    if unknown:
        stream_names = {m.name for m in STREAM_METHODS}
        concurrency_names = {m.name for m in CONCURRENCY_METHODS}
        if all(n in concurrency_names for n in unknown):
            return _fail(f"--methods {' '.join(unknown)}: only with --concurrency (without it: "
                         f"{', '.join(m.name for m in METHODS)})")
        mode = ("--stream" if all(n in stream_names for n in unknown) else
                "--gpu" if not any(n in stream_names for n in unknown) else "--gpu or --stream")
        return _fail(f"--methods {' '.join(unknown)}: only with {mode} (without it: "
                     f"{', '.join(m.name for m in METHODS)})")
    if args.plot is not None:
        problem = matplotlib_missing()
        if problem:
            return _fail(problem)
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path not in (None, "-") and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return _fail(f"{option} {path}: no such directory")
    sizes = [n for word in args.sizes for n in word] if args.sizes else list(DEFAULT_SIZES)
    try:
        check_arguments(sizes, dtype=args.dtype, reps=args.reps, min_reps=args.min_reps,
                        max_reps=args.max_reps, budget=args.budget, warmup=args.warmup)
    except ValueError as exc:
        return _fail(str(exc))
    chosen = None if args.methods is None else [m for m in METHODS if m.name in args.methods]

    def measure(url: str, server: str, http_url: str | None) -> dict:
        return run(url, sizes, dtype=args.dtype, reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                   budget=args.budget, warmup=args.warmup, methods=chosen, progress=_progress, server=server,
                   http_url=http_url)

    results = _measure_and_print(args, measure, format_table, "starting a local Triton server ...")
    if results is None:
        return 1
    if args.plot is not None:
        write_plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _mode_arguments(args: argparse.Namespace, flag: str, methods: Sequence[type], default_sizes: Sequence[int],
                    models: str) -> tuple[list[int], list[type] | None] | str:
    """What the --gpu, --stream and --concurrency modes check alike: the methods are the mode's,
    FP32 only (their *models*), no --plot, the --json directory exists.  Returns the sizes and the
    chosen methods (None: all), or the message to fail with."""
    names = [m.name for m in methods]
    unknown = [name for name in args.methods or () if name not in names]
    if unknown:
        return f"--methods {' '.join(unknown)}: not a {flag} method (those are: {', '.join(names)})"
    if args.dtype != "fp32":
        return f"{flag} measures FP32 only ({models}), not --dtype {args.dtype}"
    if args.plot is not None:
        return f"--plot is not available with {flag} (use --json)"
    if args.json not in (None, "-") and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        return f"--json {args.json}: no such directory"
    sizes = [n for word in args.sizes for n in word] if args.sizes else list(default_sizes)
    chosen = None if args.methods is None else [m for m in methods if m.name in args.methods]
    return sizes, chosen


def _run_gpu_bench(args: argparse.Namespace) -> int:
    """``tritonshm bench --gpu``: every argument checked, then CUDA and torch, then the run."""
    checked = _mode_arguments(args, "--gpu", GPU_METHODS, GPU_SIZES, "identity_fp32_gpu and identity_fp32")
    if isinstance(checked, str):
        return _fail(checked)
    sizes, chosen = checked
    try:
        check_arguments(sizes, dtype="fp32", reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                        budget=args.budget, warmup=args.warmup)
    except ValueError as exc:
        return _fail(str(exc))
    problem = gpu_missing()
    if problem:
        return _fail(problem)

    def measure(url: str, server: str, http_url: str | None) -> dict:  # gRPC only
        return run_gpu(url, sizes, reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                       budget=args.budget, warmup=args.warmup, methods=chosen, progress=_progress, server=server)

    results = _measure_and_print(args, measure, format_gpu_table,
                                 "starting a local Triton server (with the GPU model's repository) ...",
                                 server_arguments())
    return 1 if results is None else 0


def _run_stream_bench(args: argparse.Namespace) -> int:
    """``tritonshm bench --stream``: every argument checked, then the run."""
    checked = _mode_arguments(args, "--stream", STREAM_METHODS, STREAM_SIZES, "stream_fp32")
    if isinstance(checked, str):
        return _fail(checked)
    sizes, chosen = checked
    responses = DEFAULT_RESPONSES if args.responses is None else args.responses
    try:
        check_arguments(sizes, dtype="fp32", reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                        budget=args.budget, warmup=args.warmup)
        check_responses(responses)
    except ValueError as exc:
        return _fail(str(exc))

    def measure(url: str, server: str, http_url: str | None) -> dict:  # gRPC only
        return run_stream(url, sizes, responses=responses, reps=args.reps, min_reps=args.min_reps,
                          max_reps=args.max_reps, budget=args.budget, warmup=args.warmup, methods=chosen,
                          progress=_progress, server=server)

    results = _measure_and_print(args, measure, format_stream_table, "starting a local Triton server ...")
    return 1 if results is None else 0


def _run_concurrency_bench(args: argparse.Namespace) -> int:
    """``tritonshm bench --concurrency N``: every argument checked, then the run."""
    checked = _mode_arguments(args, "--concurrency", CONCURRENCY_METHODS, CONCURRENCY_SIZES, "identity_fp32")
    if isinstance(checked, str):
        return _fail(checked)
    sizes, chosen = checked
    for option, value, default in (("--budget", args.budget, DEFAULT_BUDGET),
                                   ("--min-reps", args.min_reps, DEFAULT_MIN_REPS),
                                   ("--max-reps", args.max_reps, DEFAULT_MAX_REPS)):
        if value != default:
            return _fail(f"{option}: not with --concurrency (each measurement runs --duration seconds, "
                         f"--reps rounds of them)")
    duration = DEFAULT_DURATION if args.duration is None else args.duration
    rounds = DEFAULT_ROUNDS if args.reps is None else args.reps
    try:
        check_arguments(sizes, dtype="fp32", reps=None, min_reps=DEFAULT_MIN_REPS, max_reps=DEFAULT_MAX_REPS,
                        budget=DEFAULT_BUDGET, warmup=1)
        check_concurrency(args.concurrency, duration, rounds, args.warmup)
    except ValueError as exc:
        return _fail(str(exc))

    def measure(url: str, server: str, http_url: str | None) -> dict:
        return run_concurrency(url, sizes, concurrency=args.concurrency, duration=duration, rounds=rounds,
                               warmup=args.warmup, methods=chosen, progress=_progress, server=server,
                               http_url=http_url)

    results = _measure_and_print(args, measure, format_concurrency_table, "starting a local Triton server ...")
    return 1 if results is None else 0
