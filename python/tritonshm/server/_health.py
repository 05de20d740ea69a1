"""Is the server up? Its ports, its HTTP health endpoints, and what its log says went wrong.

The probes talk HTTP to the server's loopback address with the standard
library only (urllib is imported on first use, not at import time), and
never through a proxy. A server that exits during startup is judged by its
log: a port someone else took is worth retrying on other ports; anything
else is reported with the log's error lines.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

# Logged by every CPU-only start; not the reason anything failed.
_HARMLESS_ERRORS = ("CudaDriverHelper has not been initialized",)


class _PortInUse(Exception):
    """tritonserver could not bind a port we picked (someone else took it)."""


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    """Whether *port* on 127.0.0.1 cannot be bound now: something listens there (or holds it bound).

    SO_REUSEADDR as servers set it: connections of a stopped server left in TIME_WAIT do not count.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _port_in_use(log: str) -> bool:
    """Whether the server's *log* says it could not bind one of its ports."""
    return "already in use" in log or "Address in use" in log


def _loader_failed(log: str) -> bool:
    """Whether the server's *log* says the dynamic loader could not run it (no server ran at all)."""
    return ("error while loading shared libraries" in log
            or re.search(r"version `GLIBC_[\d.]+' not found", log) is not None)


def _log_summary(text: str, lines: int) -> str:
    """What a run logged, for an exception message: its error lines, then its last *lines* lines.

    Triton prints wide status tables just before it exits, so the error
    that matters (a model that failed to load) is often above the tail.
    """
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("+-")]
    errors = [line for line in kept
              if line[:1] == "E" and line[1:5].isdigit() and not any(n in line for n in _HARMLESS_ERRORS)]
    tail = "\n".join(kept[-lines:])
    if errors:
        return "errors:\n" + "\n".join(errors[:10]) + "\nlast lines:\n" + tail
    return tail


def _open(request: Any, timeout: float = 2.0) -> Any:
    """urlopen for our loopback server; urllib is imported here, not at import time (~15 ms)."""
    import urllib.request

    # Loopback only: ignore http_proxy and friends, which would route 127.0.0.1 elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(request, timeout=timeout)


def _http_ok(url: str) -> bool:
    """Whether GET *url* answers 200 (False for any other status, or no answer)."""
    import http.client
    import urllib.error

    try:
        with _open(url) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:  # 400 while not ready
        exc.close()  # it holds the connection: no ResourceWarning later
        return False
    # URLError is an OSError; a server that is just coming up may also send a
    # broken status line.
    except (OSError, http.client.HTTPException):
        return False


def _models_not_ready(base: str) -> list[str] | None:
    """Names of the loaded or loading models that are not READY; None if the server did not answer.

    Models without a state were never asked to load (``--model-control-mode=explicit``).
    """
    import http.client
    import urllib.request

    req = urllib.request.Request(base + "/v2/repository/index", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with _open(req) as resp:
            index = json.loads(resp.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return [m.get("name", "?") for m in index if m.get("state") not in (None, "", "READY")]
