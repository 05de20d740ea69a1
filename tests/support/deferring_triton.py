"""Triton 2.53's unregister on top of the Triton 2.51 the tests run: deferred, not refused.

Triton 2.50-2.52 refuse to unregister a shared-memory region that a running
request uses ("... it is currently in use").  From 2.53 (server PR #7743,
``SharedMemoryManager::UnregisterHelper``) the same call *succeeds* at once:
the region is marked ``awaiting_unregister_`` and stays in the server's map --
listed by the status call, its name refused to a new registration ("already
in manager"), its mapping (a CUDA IPC handle: our memory) open -- until the
requests that use it end, when the server removes it itself.  So on a current
server a successful unregister says nothing about whether the server is done.

:class:`DeferringUnregisters` makes the 2.51 server here answer so: where it
refuses an unregister because the region is in use, tritonclient's call
returns as if it succeeded, and a thread of its own asks the server again
until it lets go -- which is when 2.53 would remove the region.  Everything
else is the server's own: the status call lists the region meanwhile, a
registration of the name is refused, and the server keeps the memory open
(the fake CUDA runtime catches memory freed under it: ``freed_while_open``).
Test code; patches tritonclient's gRPC and HTTP client classes for the test.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tritonclient.utils import InferenceServerException

__all__ = ["DeferringUnregisters"]

_IN_USE = "currently in use"
_METHODS = ("unregister_system_shared_memory", "unregister_cuda_shared_memory")


class DeferringUnregisters:
    """Install with :meth:`install` (a ``monkeypatch``); :attr:`deferred` counts the unregisters
    answered as 2.53 does; :meth:`settle` waits until the server removed every one of them."""

    def __init__(self, server: Any):
        self._urls = {"grpc": server.grpc_url, "http": server.http_url}
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str, str]] = []  # (protocol, method, name)
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._real: dict[tuple[str, str], Any] = {}  # tritonclient's own methods
        self.deferred = 0

    def install(self, monkeypatch: Any) -> "DeferringUnregisters":
        import tritonclient.grpc
        import tritonclient.grpc.aio
        import tritonclient.http

        for protocol, cls in (("grpc", tritonclient.grpc.InferenceServerClient),
                              ("http", tritonclient.http.InferenceServerClient)):
            for method in _METHODS:
                monkeypatch.setattr(cls, method, self._deferring(protocol, method, getattr(cls, method)))
        for method in _METHODS:  # (the aio gRPC client's: what it defers, the thread removes over gRPC)
            cls = tritonclient.grpc.aio.InferenceServerClient
            monkeypatch.setattr(cls, method, self._deferring_aio(method, getattr(cls, method)))
        self._thread = threading.Thread(target=self._remove_when_done, name="deferring-triton", daemon=True)
        self._thread.start()
        return self

    def _deferring(self, protocol: str, method: str, real: Any) -> Any:
        self._real[protocol, method] = real

        def unregister(client: Any, name: str = "", *args: Any, **kwargs: Any) -> Any:
            try:
                return real(client, name, *args, **kwargs)
            except InferenceServerException as exc:
                self._defer(protocol, method, name, exc)

        return unregister

    def _deferring_aio(self, method: str, real: Any) -> Any:
        async def unregister(client: Any, name: str = "", *args: Any, **kwargs: Any) -> Any:
            try:
                return await real(client, name, *args, **kwargs)
            except InferenceServerException as exc:
                self._defer("grpc", method, name, exc)

        return unregister

    def _defer(self, protocol: str, method: str, name: str, refusal: InferenceServerException) -> None:
        """The server refused to unregister *name* (*refusal*): if because it is in use, say yes
        and remove it once the server lets go (2.53: "will be unregistered after in-flight
        requests complete"), else raise the refusal."""
        if not name or _IN_USE not in str(refusal):
            raise refusal
        with self._lock:
            if (protocol, method, name) not in self._pending:  # (asked again: still the one removal)
                self._pending.append((protocol, method, name))
            self.deferred += 1
        self._wake.set()

    def _remove_when_done(self) -> None:
        # The server's own removal, when the requests that use a region end: asked here until the
        # 2.51 underneath no longer refuses.  (HTTP clients work only in the thread that made them.)
        import tritonclient.grpc
        import tritonclient.http

        clients = {"grpc": tritonclient.grpc.InferenceServerClient(self._urls["grpc"]),
                   "http": tritonclient.http.InferenceServerClient(self._urls["http"])}
        real = self._real
        try:
            while not self._stopped:
                self._wake.wait(0.01)
                self._wake.clear()
                with self._lock:
                    pending = list(self._pending)
                for entry in pending:
                    protocol, method, name = entry
                    try:
                        real[protocol, method](clients[protocol], name)
                    except InferenceServerException as exc:
                        if _IN_USE in str(exc):
                            continue
                    with self._lock:
                        self._pending.remove(entry)
        finally:
            for client in clients.values():
                client.close()
            import gevent

            gevent.get_hub().destroy(destroy_loop=True)  # (the HTTP client's, made in this thread)

    def settle(self, seconds: float = 10.0) -> None:
        """Wait until the server removed every region whose unregister it deferred."""
        deadline = time.monotonic() + seconds
        while True:
            with self._lock:
                if not self._pending:
                    return
            assert time.monotonic() < deadline, f"the server still holds {self._pending}"
            time.sleep(0.01)

    def stop(self) -> None:
        self.settle()
        self._stopped = True
        if self._thread is not None:
            self._thread.join()
