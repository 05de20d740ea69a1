"""Threads of the blocking client: a small worker pool, and the connections.

HTTP clients of tritonclient run on gevent and work only in the thread that
made them, so the blocking client carries HTTP calls out on I/O threads of
its own (:class:`Connector`); gRPC clients are thread-safe and shared.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import time
from typing import Any, Callable

from .._transport import release_gevent_hub
from ..errors import ServerTimeout

__all__ = ["Workers", "Connector"]


class Workers:
    """A fixed set of worker threads fed from a queue, returning Futures.

    Unlike ``ThreadPoolExecutor`` each worker runs *on_exit* in its own
    thread before it ends, so per-thread state (an HTTP connection and its
    gevent hub) is released by the thread that owns it.
    """

    def __init__(self, count: int, name: str, on_exit: Callable[[], None] | None = None):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_exit = on_exit
        self._idents: set[int] = set()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(count)]
        for thread in self._threads:
            thread.start()

    def owns_current_thread(self) -> bool:
        """True inside one of these workers."""
        return threading.get_ident() in self._idents

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Run ``fn(*args, **kwargs)`` on a worker; its Future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        self._idents.add(threading.get_ident())
        try:
            while (item := self._queue.get()) is not None:
                future, fn, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
                del future, fn, args, kwargs, item  # drop leases before waiting again
        finally:
            if self._on_exit is not None:
                self._on_exit()

    def cancel_queued(self) -> None:
        """Cancel the work queued and not yet started: its Futures end cancelled (a client that
        closes without waiting for its requests)."""
        stops = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stops += 1  # a shutdown's: put back below
            else:
                item[0].cancel()
        for _ in range(stops):
            self._queue.put(None)

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Finish queued work, then stop every worker; with *wait*, wait for them -- for up to
        *timeout* seconds in all (None: for as long as they take).

        A garbage-collected client calls this with ``wait=False``: it may
        run on one of these very threads, or at a time nothing may block.
        A worker still blocked at *timeout* (on a server that hangs) is left
        to end by itself: the threads are daemons.
        """
        for _ in self._threads:
            self._queue.put(None)
        if not wait:
            return
        ends = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(None if ends is None else max(0.0, ends - time.monotonic()))


class Connector:
    """Runs tritonclient calls for one server; holds no reference to a Client.

    gRPC clients are thread-safe, so one shared client serves every thread.
    HTTP clients run on gevent and work only in the thread that made them,
    so HTTP calls are carried out by a few I/O threads of our own, each with
    its own client, which it closes (and its gevent hub with it) on exit.
    User threads never touch gevent.
    """

    def __init__(self, connect: Callable[[], Any], http: bool, io_threads: int):
        self.http = http
        self.new = connect  # a new tritonclient client, TLS and verbosity included
        # gRPC: the one client every call uses, made on first use.  HTTP:
        # made only if the user asks for Client.tritonclient, as gevent ties
        # it to the asking thread.
        self._shared = None
        self._io_threads = io_threads
        self._creator_pid = os.getpid()
        self._io: Workers | None = None
        self._local = threading.local()   # an I/O thread's own HTTP client
        self._lock = threading.Lock()
        self._closed = False

    @property
    def shared(self) -> Any:
        """The client handed to users as ``Client.tritonclient``."""
        if self._shared is None:
            with self._lock:
                if self._shared is None:
                    self._shared = self.new()
        return self._shared

    def call(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Any:
        """``fn(client)`` with a tritonclient client that is safe in this thread -- after
        :meth:`close`, a short-lived one of its own (a call that must still reach the server:
        unregistering memory whose registration's reply came after the client closed).

        *timeout* bounds the wait for an HTTP call carried out on an I/O thread (past it,
        :class:`~tritonshm.ServerTimeout`; the thread ends the call by its ``network_timeout``);
        *fn* bounds its own calls otherwise (gRPC's ``client_timeout``)."""
        if not self.http and not self._closed:
            return fn(self._shared or self.shared)
        io = None if not self.http else self._io_workers()
        if io is None:
            # Closing (or closed): a short-lived client of this thread's own.
            client = self.new()
            try:
                return fn(client)
            finally:
                client.close()
        if io.owns_current_thread():
            return fn(self._thread_client())
        try:
            return io.submit(lambda: fn(self._thread_client())).result(timeout)
        except concurrent.futures.TimeoutError:
            raise ServerTimeout(f"the server did not answer within {timeout:g} s") from None

    def cut_off(self) -> None:
        """Close the shared gRPC client under the calls in flight on it -- they end CANCELLED, as
        under tritonclient's ``close()`` -- and make a new one for the calls after them.  (HTTP
        calls run on the I/O threads' own clients, each call bounded by its timeout: left be.)"""
        if self.http:
            return
        with self._lock:
            cut, self._shared = self._shared, None
        if cut is not None:
            cut.close()

    def _io_workers(self) -> Workers | None:
        with self._lock:
            if self._io is None and not self._closed:
                self._io = Workers(self._io_threads, "tritonshm-http", self._release_thread_client)
            return self._io

    def _thread_client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self.new()
        return client

    def _release_thread_client(self) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            return
        self._local.client = None
        client.close()
        release_gevent_hub()

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop the I/O threads -- waiting for them with *wait*, for up to *timeout* seconds --
        and close the shared client; idempotent.

        In a forked child this does nothing: the connections (and the
        threads behind them) belong to the parent, and gRPC's must not be
        touched after a fork.
        """
        if os.getpid() != self._creator_pid:
            return
        with self._lock:
            io, self._io, self._closed = self._io, None, True
        if io is not None:
            io.shutdown(wait, timeout)
        if self._shared is not None:
            try:
                self._shared.close()
            except Exception:
                pass  # closing a connection to a dead server may fail; nothing to keep
