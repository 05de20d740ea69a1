"""The ``tritonshm`` command (also ``python -m tritonshm``).

Subcommands: ``demo``, ``server``, ``bench``, ``ls``, ``gc``, ``doctor``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any, Sequence

from . import _segments
from ._units import in_units

KiB = 1024
MiB = 1024 * KiB


def _cmd_ls(args: argparse.Namespace) -> int:
    segments = _segments.list_segments()
    if not segments:
        print("no tritonshm segments in /dev/shm")
    else:
        print(f"{'key':<45} {'pid':>8} {'state':<6} {'size':>12}")
        for seg in segments:
            state = "live" if seg.alive else "dead"
            print(f"{seg.key:<45} {seg.pid:>8} {state:<6} {in_units(seg.nbytes):>12}")
    return 0 if args.url is None else _ls_server(args.url)


# Names tritonshm registers: a segment's key, a CUDA region's "tritonshm-cuda-<pid>-<hex>", a
# lent allocation's "tritonshm-lent-<pid>-<hex>".
_OUR_NAME = re.compile(r"^tritonshm-(?:cuda-|lent-)?(\d+)-[0-9a-f]+$")
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]", "ip6-localhost"}


def _registrations(url: str, command: str) -> tuple[Any, list[tuple[str, str, str, int]], str | None] | None:
    """A tritonclient connected to *url* and the regions its server has registered (name, kind,
    device, bytes), system and CUDA, with a note where the CUDA list could not be read; None
    (after saying why, as *command*) where the server cannot be asked.  The caller closes it."""
    from . import _transport, triton
    from .errors import Error

    wire, address, ssl = _transport.parse_url(url)
    try:
        client = wire.connect(address, ssl=ssl)
    except Exception as exc:  # noqa: BLE001 - tritonclient raises its own types
        print(f"tritonshm {command}: cannot connect to {url}: {exc}", file=sys.stderr)
        return None
    cuda_note = None
    try:
        regions = [(name, "system", "", entry["byte_size"]) for name, entry in triton.status(client).items()]
        try:
            regions += [(name, "cuda", f"cuda:{entry['device_id']}", entry["byte_size"])
                        for name, entry in triton.status(client, kind="cuda").items()]
        except Error as exc:  # a CPU-only server may have no CUDA shared memory at all
            cuda_note = f"(no CUDA shared-memory list from the server: {exc})"
    except Error as exc:
        client.close()
        print(f"tritonshm {command}: {exc}", file=sys.stderr)
        return None
    return client, regions, cuda_note


def _owner(name: str) -> tuple[str, str]:
    """(pid, state) of a registration's name: ours ("live" or "gone" here) or another's."""
    ours = _OUR_NAME.match(name)
    if ours is None:
        return "-", "other"
    return ours[1], "live" if _segments.pid_alive(int(ours[1])) else "gone"


def _ls_server(url: str) -> int:
    """The regions the server at *url* has registered, system and CUDA; ours with their pid.

    CUDA pools live in device memory, not /dev/shm: the server's list is where they show.
    The state column says whether that pid runs here: it means nothing for a remote server.
    """
    asked = _registrations(url, "ls")
    if asked is None:
        return 1
    client, regions, cuda_note = asked
    client.close()
    print(f"\nregistered with the server at {url}:" if regions else f"\nnothing registered with the server at {url}")
    if regions:
        print(f"{'name':<45} {'kind':<6} {'device':<7} {'pid':>8} {'state':<6} {'size':>12}")
    gone = 0
    for name, kind, device, nbytes in sorted(regions):
        pid, state = _owner(name)
        gone += state == "gone"
        print(f"{name:<45} {kind:<6} {device or '-':<7} {pid:>8} {state:<6} {in_units(nbytes):>12}")
    if gone:
        print(f"{gone} registration(s) of processes gone: `tritonshm gc --url {url}` unregisters them")
    if cuda_note is not None:
        print(cuda_note)
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    removed = _segments.collect_garbage(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for seg in removed:
        print(f"{verb} {seg.key} (unlocked, pid {seg.pid} is gone, {in_units(seg.nbytes)})")
    print(f"{verb} {len(removed)} segment(s)")
    return 0 if args.url is None else _gc_server(args.url, args.dry_run)


def _gc_server(url: str, dry_run: bool) -> int:
    """Unregister, on the server at *url*, the registrations of ours whose process is gone (only
    names tritonshm makes, never another program's).  Only for a server on this machine: the
    pid in a name is one of this machine's processes."""
    from . import _transport, triton
    from .errors import Error

    host = _transport.parse_url(url)[1].rpartition(":")[0]
    if host not in _LOOPBACK:
        print(f"tritonshm gc: --url {url}: the pids in our names are this machine's processes, so only a "
              f"server reached on this machine (localhost, 127.0.0.1, ::1) can be cleaned from here; run "
              f"`tritonshm gc --url` where the clients ran", file=sys.stderr)
        return 2
    asked = _registrations(url, "gc")
    if asked is None:
        return 1
    client, regions, _ = asked
    verb = "would unregister" if dry_run else "unregistered"
    count, failed = 0, 0
    try:
        for name, kind, _, nbytes in sorted(regions):
            pid, state = _owner(name)
            if state != "gone":
                continue
            if not dry_run:
                # Not triton.unregister(), which takes only this process's own names: these are
                # names of ours (the pattern) left by processes gone -- a name, never "all".
                method = "unregister_cuda_shared_memory" if kind == "cuda" else "unregister_system_shared_memory"
                try:
                    triton.call_translated(client, f"unregistering {name!r}", method, name)
                except Error as exc:
                    print(f"tritonshm gc: {name}: {exc}", file=sys.stderr)
                    failed += 1
                    continue
            count += 1
            print(f"{verb} {name} on {url} ({kind}, pid {pid} is gone, {in_units(nbytes)})")
    finally:
        client.close()
    print(f"{verb} {count} registration(s) on {url}")
    return 1 if failed else 0


def _server_options(args: argparse.Namespace, command: str) -> dict | None:
    """LocalServer's install options from --install-from and --verbose; None (after saying why) if unusable."""
    import os

    if args.install_from is not None and not os.path.isdir(args.install_from):
        print(f"tritonshm {command}: --install-from {args.install_from}: not a directory", file=sys.stderr)
        return None
    return {"wheels": args.install_from, "verbose": args.verbose}


def _cmd_server(args: argparse.Namespace) -> int:
    from .errors import InvalidOption, ServerUnavailable
    from .server import LocalServer, describe_install

    options = _server_options(args, "server")
    if options is None:
        return 2
    try:
        ports = {"grpc_port": args.grpc_port, "http_port": args.http_port}
        LocalServer(model_repository=args.model_repository, **options, **ports)  # checks the ports
    except InvalidOption as exc:
        print(f"tritonshm server: {exc}", file=sys.stderr)
        return 2
    if args.install_only:
        # $TRITONSHM_TRITONSERVER names an existing install: check it and say
        # what was found, installing nothing; else our own venv, and its path.
        try:
            info = LocalServer(model_repository=args.model_repository, **options).install()
        except (ServerUnavailable, ValueError) as exc:
            print(f"tritonshm server: {exc}", file=sys.stderr)
            return 1
        print(describe_install(info) if info.get("existing") else info["venv"])
        return 0
    try:
        srv = LocalServer(model_repository=args.model_repository, **options, **ports).start()
    except ServerUnavailable as exc:
        print(f"tritonshm server: {exc}", file=sys.stderr)
        return 1
    with srv:
        print(f"Triton is ready: gRPC {srv.grpc_url}  HTTP {srv.http_url}  log {srv.log_path}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopping")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    options = _server_options(args, "demo")
    if options is None:
        return 2
    return run_demo(sizes=[s * KiB for s in args.sizes_kib], seconds=args.seconds, **options)


def _add_install_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--install-from", metavar="DIR", default=None,
                        help="install the server from this folder of wheels, without a package index "
                             "(also $TRITONSHM_SERVER_WHEELS); fill it on a connected machine with: "
                             "pip download --no-deps nvidia-pytriton==0.7.0 \"numpy<2\" -d DIR "
                             "--python-version X.Y --only-binary=:all:")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show pip's own output while the server is installed")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(server_url=args.url)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args)


def _version_line() -> str:
    """``tritonshm X.Y.Z (Python A.B.C, numpy D.E.F)``: what ``--version`` prints.

    The version is ``tritonshm.__version__``, the one place it is written; a
    built wheel's metadata is read from it (pyproject.toml), so the two agree.
    """
    import platform

    import numpy

    from . import __version__

    return f"tritonshm {__version__} (Python {platform.python_version()}, numpy {numpy.__version__})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tritonshm`` command."""
    parser = argparse.ArgumentParser(
        prog="tritonshm", description="Zero-copy shared memory for NVIDIA Triton Inference Server."
    )
    parser.add_argument("--version", action="version", version=_version_line(),
                        help="print tritonshm's version (and Python's and numpy's) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="start a local Triton and compare plain gRPC with tritonshm.Client (gRPC, HTTP)")
    demo.add_argument("--sizes-kib", nargs="+", type=int, default=[4, 64, 1024, 16 * 1024, 64 * 1024],
                      metavar="KIB", help="tensor sizes in KiB (default: 4 KiB to 64 MiB)")
    demo.add_argument("--seconds", type=float, default=0.5,
                      help="time spent measuring each size and transport (default 0.5)")
    _add_install_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    server = sub.add_parser("server", help="run a local Triton with the demo models until Ctrl-C")
    server.add_argument("--model-repository", default=None, help="default: the bundled demo models")
    server.add_argument("--install-only", action="store_true",
                        help="only install the server environment, print its path; with "
                             "$TRITONSHM_TRITONSERVER, check that install and say what it found")
    server.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                        help="serve gRPC on this port of 127.0.0.1 (default: a free one; 8001 is Triton's usual)")
    server.add_argument("--http-port", type=int, default=None, metavar="PORT",
                        help="serve HTTP on this port of 127.0.0.1 (default: a free one; 8000 is Triton's usual)")
    _add_install_arguments(server)
    server.set_defaults(func=_cmd_server)

    from . import bench as _bench

    bench = sub.add_parser(
        "bench", help="end-to-end benchmark: tritonshm against plain gRPC, tritonclient's shm utilities "
                      "and triton-shm-client, with the floor and the limit",
        **_bench.parser_options(),
    )
    _bench.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    ls = sub.add_parser("ls", help="list this library's segments in /dev/shm (and a server's registrations)")
    ls.add_argument("--url", default=None,
                    help="also list what the Triton server at this URL has registered, system and CUDA "
                         "(CUDA pools show only there)")
    ls.set_defaults(func=_cmd_ls)

    gc = sub.add_parser("gc", help="remove segments whose creating process is dead (no process holds their lock)")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    gc.add_argument("--url", default=None,
                    help="also unregister, on the Triton server at this URL (on this machine), the "
                         "registrations of ours whose process is gone -- never another program's")
    gc.set_defaults(func=_cmd_gc)

    doctor = sub.add_parser("doctor", help="diagnose /dev/shm, permissions and server co-location")
    doctor.add_argument("--url", default=None,
                        help="a Triton server to check: host:port (gRPC) or http://host:port (HTTP)")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tritonshm`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
