"""``tritonshm doctor``: why shared memory might not work here, in plain words.

Checks /dev/shm (mounted, size, free space), that a segment can be created
with the expected name and mode, this library's stale segments, whether CUDA
is usable here, and -- given a server URL -- that the server can open our
memory (system shared memory, and CUDA IPC handles where there is a GPU).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from . import _segments
from ._memory import SystemRegion
from .errors import Error

_SMALL_SHM = 256 * 1024 * 1024  # below this, large tensors will not fit (Docker's default is 64 MB)


def _report(ok: bool | None, what: str) -> bool:
    mark = {True: "ok  ", False: "FAIL", None: "warn"}[ok]
    print(f"[{mark}] {what}")
    return ok is not False


def run_doctor(server_url: str | None = None) -> int:
    """Print one line per check; 0 when nothing failed."""
    healthy = True
    try:
        fs = os.statvfs(_segments.SHM_DIR)
    except OSError as exc:
        _report(False, f"/dev/shm is not usable: {exc}")
        return 1
    total, free = fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize
    healthy &= _report(
        None if total < _SMALL_SHM else True,
        f"/dev/shm: {total / 2**20:.0f} MiB, {free / 2**20:.0f} MiB free"
        + (" (small: in Docker use --shm-size=1g or --ipc=host)" if total < _SMALL_SHM else ""),
    )
    try:
        with SystemRegion.create(4096) as region:
            mode = stat.S_IMODE(os.stat(_segments.SHM_DIR / region.key.lstrip("/")).st_mode)
            healthy &= _report(mode == 0o600, f"created {region.key} with mode {mode:o} (want 600)")
            probe = SystemRegion.attach(region.key, readonly=True)
            probe.close()
            healthy &= _report(True, "attach by key works")
    except Error as exc:
        healthy &= _report(False, f"cannot create a segment: {exc}")
    dead = [s for s in _segments.list_segments() if not s.alive]
    healthy &= _report(
        None if dead else True,
        f"{len(dead)} segment(s) of dead processes" + (" (run `tritonshm gc`)" if dead else ""),
    )
    gpu = _check_cuda()
    if server_url is not None:
        healthy &= _check_server(server_url, gpu)
    return 0 if healthy else 1


#: Where the whole recipe is: docs/deployment.md in the repository (the documentation site's
#: "Deployment" page).
_RECIPE = "docs/deployment.md"


def deployment_hints(address: str, said: str, environ: Any = None) -> list[str]:
    """What this machine shows to be missing when a server at *address* (``host:port``) cannot
    open our memory, having said *said*: one line each, the likeliest first (see
    docs/deployment.md for the whole recipe).  *environ* stands in for ``os.environ`` (tests)."""
    environ = os.environ if environ is None else environ
    host = address.rsplit(":", 1)[0].strip("[]")
    hints = []
    if host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("127."):
        hints.append(f"the server is at {host}, not on this machine's loopback: shared memory works only "
                     f"with a server on this machine (tritonshm falls back to the wire there)")
    if "allow" in said.lower():
        hints.append("Triton >= 2.69 opens client memory only when started with --allow-client-shm=true")
    if environ.get("KUBERNETES_SERVICE_HOST"):
        hints.append("in a Kubernetes pod: mount one memory-backed emptyDir at /dev/shm in both the app's and "
                     "Triton's containers (medium: Memory, sized for the pools), run both as the same user, "
                     f"and reach Triton on localhost ({_RECIPE}, Kubernetes)")
    elif os.path.exists("/.dockerenv") or environ.get("container"):
        hints.append("in a container: share /dev/shm with Triton's (docker run --ipc=container:<triton> or "
                     f"--ipc=host; --shm-size for the pools) and run both as the same user ({_RECIPE}, Docker)")
    hints.append("our segments are mode 0600: Triton must run as the same user as this process "
                 f"(uid {os.getuid()}) and see the same /dev/shm ({_RECIPE})")
    return hints


def _check_cuda() -> bool:
    """Report the CUDA runtime (a warning, never a failure: CUDA is optional)."""
    from . import cuda

    info = cuda.runtime_info()
    if not info["available"]:
        _report(None, f"CUDA: not usable ({info['error']}); system shared memory only")
        return False
    names = ", ".join(f"{d['index']}: {d.get('name', '?')}" for d in info["devices"])
    _report(True, f"CUDA: runtime {info['runtime_version']}, driver {info['driver_version']} "
                  f"({info['library']}); devices {names}")
    return True


def _check_server(url: str, gpu: bool) -> bool:
    from . import _transport, triton
    from .cuda import CudaRegion

    def opens(region: object) -> str | None:
        """None when the server registered (and we unregistered) *region*, else why not."""
        try:
            name = triton.register(client, region)
        except Error as exc:
            return str(exc)
        triton.unregister(client, name)
        return None

    transport, address, ssl = _transport.parse_url(url)
    client = transport.connect(address, ssl=ssl)
    try:
        # Reachable first: a server that is not there is not one that cannot use our memory.
        try:
            live = triton.call_translated(client, "asking whether it is live", "is_server_live")
        except Error as exc:
            return _report(False, f"the server at {url} is unreachable: {exc}")
        if not live:
            return _report(False, f"the server at {url} answers, but says it is not live")
        with SystemRegion.create(4096) as region:
            why = opens(region)
        if why is not None:
            _report(False, f"the server at {url} cannot use our memory: {why}")
            for hint in deployment_hints(address, why):
                print(f"       - {hint}")
            return False
        _report(True, f"the server at {url} opened a segment of ours: shared memory works")
        if gpu:
            with CudaRegion.create(4096) as device_region:
                why = opens(device_region)
            # A warning: system shared memory still works without CUDA IPC.
            _report(None if why else True, f"the server at {url} cannot open our CUDA memory: {why}"
                    if why else f"the server at {url} opened a CUDA IPC handle of ours: CUDA shared memory works")
        return True
    finally:
        client.close()
