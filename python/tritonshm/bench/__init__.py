"""``tritonshm bench``: one identity request, every way, side by side, in one run.

One server (a :class:`~tritonshm.server.LocalServer` started for the run, or
``--url`` and ``--http-url``, read as :class:`~tritonshm.Client` reads a URL and
checked before anything is measured: ``_where.py``), one bundled identity model (``identity_fp32``, or
``identity_uint8`` with ``--dtype uint8``), one request per repetition with
a 1-D input of the given number of bytes.  The methods (see ``_methods.py``):

* peers, what tritonshm competes with: ``grpc`` and ``http`` (tensors
  inside the gRPC messages, or the HTTP bodies as binary data), ``tc-shm`` (tritonclient's ``shared_memory`` utilities, regions
  registered once, copy in and copy out per request), ``triton-shm-client``
  (PyPI ``triton-shm-client``, only where it is installed);
* tritonshm: ``Client.infer`` (copies in and out) and ``zero-copy``
  (``Client.request()``: the input written into the slot, the output read
  as a view of it), each also with ``-http``: the client made with the
  server's ``http://`` URL (left out under a gRPC ``--url`` without ``--http-url``;
  under an ``http://`` ``--url`` alone, the gRPC rows are left out instead);
  ``tritonshm.grpc`` and ``tritonshm.http``: tritonclient's API via tritonshm,
  the ``grpc`` and ``http`` rows' very code with the facade module imported
  in place of tritonclient's (the tensors through its slots);
* references: ``floor`` and ``floor-http`` (inputs already in a registered
  region, outputs left there: tritonclient.grpc's and tritonclient.http's
  ``infer`` call alone) and ``memcpy`` (one copy of the input's bytes);
  ``limit = floor + memcpy`` and ``limit-http = floor-http + memcpy``,
  repetition by repetition, are what a client that must take its input from
  the caller's array reaches at best over each protocol, when its request
  costs what tritonclient's does.  (tritonshm's clients send a request made
  ready ahead -- over HTTP on a connection of their own -- which can cost
  less: a ratio to the limit below 1 says so, it is no error.)

Repetitions are interleaved: each round runs every method once, in an order
drawn anew each round (no method always after the same one), so the noise of
a shared machine falls on every method alike.  Warm-up rounds come first.  Every method's output is
checked against its input in the first warm-up round and in a last round
with an input never sent before (so a stale result cannot pass);
:class:`WrongOutput` stops the run.

Results (``run()``'s return value, and what ``--json`` writes)::

    {"format": "tritonshm-bench/2",
     "meta": {model, datatype, sizes, reps (per size), server_version, tritonshm_version,
              cpu_count, cpu_affinity, versions, methods {name: {group, description, status}},
              peers, limit, limits {name: "floor + memcpy"}, against_limit {method: limit},
              url, http_url (host:port, or None), server ("started" | "given"), time_utc, ...},
     "results": [{"nbytes", "elements", "reps", "seconds", "best_peer",
                  "methods": {name: {"status": "ok" | "not installed", "samples_s": [...],
                                     "median_s", "p10_s", "p25_s", "p75_s", "p90_s", "iqr_s",
                                     "min_s", "max_s", "vs_best_peer", "vs_limit"}}}]}

Ratios are median time over the reference's median time: below 1 is
faster.  ``vs_limit`` is given for ``Client.infer`` and ``zero-copy`` (and their ``-http`` twins)
and for ``tritonshm.grpc`` / ``tritonshm.http``, over their own protocol's limit
(``meta.against_limit``; in ``tritonshm-bench/1`` every row's was over the gRPC limit).

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
from ..errors import InvalidOption
from ._methods import AGAINST_LIMIT, LIMITS, METHODS, MODELS, Method, Unavailable
from ._report import format_table, matplotlib_missing, write_json, write_plot
from ._stream import (
    DEFAULT_RESPONSES,
    STREAM_FORMAT,
    STREAM_METHODS,
    STREAM_MODEL,
    STREAM_SIZES,
    check_responses,
    format_stream_table,
    run_stream,
    stream_description,
)
from ._where import Addresses, require_grpc, resolve, server_version

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


#: The top of ``tritonshm bench --help``: what it does, two examples, where the rest is.
_HELP = """\
One identity-model request per repetition, every way side by side: the peers
(plain gRPC and HTTP, tritonclient's shm utilities), tritonshm's Client and
zero-copy paths, and the floor and limit they are held to. Repetitions are
interleaved and every output is checked.

examples:
  tritonshm bench
      start a local Triton for the run; every method, sizes 4K to 64M
  tritonshm bench --url localhost:8001 --http-url localhost:8000 --sizes 4K 16M
      a running server's gRPC and HTTP ports; two sizes

What each method does, and the table's columns: tritonshm bench --list-methods"""


def parser_options() -> dict:
    """What ``tritonshm bench``'s parser is made with (usage, description, formatter)."""
    return {"usage": "%(prog)s [options]", "description": _HELP,
            "formatter_class": argparse.RawDescriptionHelpFormatter}


class _ListMethods(argparse.Action):
    """``--list-methods``: print every method of every mode and the table's legend, then exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(description())
        parser.exit()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tritonshm bench``, in four groups: what to measure, where, how long, output."""
    names = [m.name for m in METHODS]
    names += [m.name for m in GPU_METHODS if m.name not in names]
    names += [m.name for m in STREAM_METHODS]
    names += [m.name for m in CONCURRENCY_METHODS]
    what = parser.add_argument_group("what to measure")
    what.add_argument("--methods", nargs="+", choices=names, default=None, metavar="METHOD",
                      help="only these (default: all; names: --list-methods)")
    what.add_argument("--list-methods", action=_ListMethods,
                      help="what each method of each mode does, the columns; exit")
    what.add_argument("--sizes", nargs="+", type=_size_list, default=None, metavar="SIZE",
                      help="K/M/G of 1024 (default 4K 64K 1M 16M 64M)")
    what.add_argument("--dtype", choices=sorted(MODELS), default="fp32",
                      help="identity_fp32 or identity_uint8 (default fp32)")
    what.add_argument("--gpu", action="store_true",
                      help="from a torch tensor on cuda:0 (and identity_fp32_gpu)")
    what.add_argument("--stream", action="store_true",
                      help="streaming to stream_fp32: first response, responses/s")
    what.add_argument("--responses", type=int, default=None, metavar="N",
                      help=f"with --stream: responses per request (default {DEFAULT_RESPONSES})")
    what.add_argument("--concurrency", type=int, default=None, metavar="N",
                      help="requests/s of N threads or tasks sharing one client")
    where = parser.add_argument_group("where (default: a local server started for the run)")
    where.add_argument("--url", default=None, metavar="URL",
                       help="gRPC host:port, or http://host:port (HTTP rows only)")
    where.add_argument("--http-url", default=None, metavar="URL",
                       help="with a gRPC --url: http://host:port or host:port")
    when = parser.add_argument_group("how long (per size)")
    when.add_argument("--reps", type=int, default=None, metavar="N",
                      help="exactly N repetitions (--concurrency: N rounds)")
    when.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                      help=f"without --reps: stop after this long (default {DEFAULT_BUDGET:g})")
    when.add_argument("--min-reps", type=int, default=DEFAULT_MIN_REPS, metavar="N",
                      help=f"without --reps: at least N (default {DEFAULT_MIN_REPS})")
    when.add_argument("--max-reps", type=int, default=DEFAULT_MAX_REPS, metavar="N",
                      help=f"without --reps: at most N (default {DEFAULT_MAX_REPS})")
    when.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
                      help=f"untimed rounds, the first checking outputs (default {DEFAULT_WARMUP})")
    when.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                      help=f"with --concurrency: each measurement (default {DEFAULT_DURATION:g})")
    out = parser.add_argument_group("output (the table: stdout; stderr with --json -)")
    out.add_argument("--json", default=None, metavar="PATH",
                     help="also all samples and metadata as JSON ('-': stdout)")
    out.add_argument("--plot", default=None, metavar="PNG",
                     help="also a plot against size (needs matplotlib)")


def description() -> str:
    """What ``--list-methods`` prints: each mode's methods, what each does, and the table's columns."""
    from ._report import legend

    lines = ["tritonshm bench (no mode option): one identity-model request per repetition, each method once per",
             "round (an order drawn anew each round); median and p25-p75 per method and size, ratios to the best peer and to",
             "the limit; every output is checked against its input. Methods:", ""]
    for m in METHODS:
        lines += textwrap.wrap(m.description, 100, initial_indent=f"  {m.name:<18} ", subsequent_indent=" " * 21)
    for limit, parts in LIMITS.items():
        lines += [f"  {limit:<18} {' + '.join(parts)}, repetition by repetition"]
    lines += legend({"limit": " + ".join(LIMITS["limit"]),
                     "limits": {name: " + ".join(parts) for name, parts in LIMITS.items()},
                     "against_limit": AGAINST_LIMIT}, pointer=False)
    return ("\n".join(lines) + "\n\n" + gpu_description() + "\n" + stream_description() + "\n"
            + concurrency_description())


def _fail(message: str, code: int = 2) -> int:
    print(f"tritonshm bench: {message}", file=sys.stderr)
    return code


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _addresses(args: argparse.Namespace, grpc_only: str | None = None) -> Addresses | None:
    """``--url`` and ``--http-url``, read as Client reads a URL: None without ``--url`` (a server is
    started for the run); :class:`~tritonshm.errors.InvalidOption` (one line) for what cannot be
    used -- in a mode whose methods are all gRPC (*grpc_only*: ``"--gpu"``), an HTTP address."""
    if args.url is None:
        if args.http_url is not None:
            raise InvalidOption("--http-url: only with --url (a server the bench starts gives its own addresses)")
        return None
    if grpc_only is not None and args.http_url is not None:
        raise InvalidOption(f"--http-url: not with {grpc_only}, whose methods are all gRPC")
    where = resolve(args.url, args.http_url, options=("--url", "--http-url"))
    if grpc_only is not None:
        require_grpc(where, grpc_only)
    return where


def _measure_and_print(args: argparse.Namespace, where: Addresses | None, model: str | None,
                       measure: Callable[[str | None, str, str | None], dict],
                       format_results: Callable[[dict], str], starting: str,
                       server_args: Sequence[str] = ()) -> int:
    """``measure(url, server, http_url)`` against the server at *where* -- once it answered at
    every address and serves *model* ready -- or against a LocalServer (with *server_args*)
    started for it after printing *starting*; then the table (on stderr when ``--json -``) and
    ``--json``.  Returns the exit status: 0, 2 when the server given cannot be used (one line
    said why), 1 when the run failed."""
    from .. import errors

    table_out = sys.stderr if args.json == "-" else sys.stdout
    try:
        if where is not None:
            try:
                server_version(where, model)
            except errors.Error as exc:
                return _fail(str(exc))
            results = measure(where.grpc, "given", where.http)
        else:
            from ..server import LocalServer

            print(starting, file=sys.stderr, flush=True)
            with LocalServer(extra_args=server_args) as server:
                results = measure(server.grpc_url, "started", server.http_url)
    except WrongOutput as exc:
        return _fail(f"FAILED, wrong output: {exc}", code=1)
    except errors.Error as exc:
        return _fail(f"FAILED: {exc}", code=1)
    print(format_results(results), file=table_out, flush=True)
    if args.json is not None:
        write_json(results, args.json)
    if args.plot is not None:
        write_plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


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
        where = _addresses(args)
    except ValueError as exc:  # (InvalidOption is a ValueError)
        return _fail(str(exc))
    chosen = None if args.methods is None else [m for m in METHODS if m.name in args.methods]

    def measure(url: str | None, server: str, http_url: str | None) -> dict:
        return run(url, sizes, dtype=args.dtype, reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                   budget=args.budget, warmup=args.warmup, methods=chosen, progress=_progress, server=server,
                   http_url=http_url)

    return _measure_and_print(args, where, MODELS[args.dtype][0], measure, format_table,
                              "starting a local Triton server ...")


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
        where = _addresses(args, grpc_only="--gpu")
    except ValueError as exc:
        return _fail(str(exc))
    problem = gpu_missing()
    if problem:
        return _fail(problem)

    def measure(url: str | None, server: str, http_url: str | None) -> dict:  # gRPC only
        return run_gpu(url, sizes, reps=args.reps, min_reps=args.min_reps, max_reps=args.max_reps,
                       budget=args.budget, warmup=args.warmup, methods=chosen, progress=_progress, server=server)

    return _measure_and_print(args, where, "identity_fp32", measure, format_gpu_table,
                              "starting a local Triton server (with the GPU model's repository) ...",
                              server_arguments())


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
        where = _addresses(args, grpc_only="--stream")
    except ValueError as exc:
        return _fail(str(exc))

    def measure(url: str | None, server: str, http_url: str | None) -> dict:  # gRPC only
        return run_stream(url, sizes, responses=responses, reps=args.reps, min_reps=args.min_reps,
                          max_reps=args.max_reps, budget=args.budget, warmup=args.warmup, methods=chosen,
                          progress=_progress, server=server)

    return _measure_and_print(args, where, STREAM_MODEL, measure, format_stream_table,
                              "starting a local Triton server ...")


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
        where = _addresses(args)
    except ValueError as exc:
        return _fail(str(exc))

    def measure(url: str | None, server: str, http_url: str | None) -> dict:
        return run_concurrency(url, sizes, concurrency=args.concurrency, duration=duration, rounds=rounds,
                               warmup=args.warmup, methods=chosen, progress=_progress, server=server,
                               http_url=http_url)

    return _measure_and_print(args, where, "identity_fp32", measure, format_concurrency_table,
                              "starting a local Triton server ...")
