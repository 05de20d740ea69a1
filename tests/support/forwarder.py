"""A loopback TCP forwarder for tests: 127.0.0.1:<port> -> a target "host:port", every connection
piped both ways in one thread, the bytes it carries counted in each direction.

Used to reach a server on a port other than its own (tests/client/test_dropin.py: tritonclient's
default port 8000) and to count what a client puts on the socket
(tests/client/test_tritonclient_facade_wire.py)::

    with Forwarder(0, server.grpc_url) as fwd:       # port 0: a free one, fwd.address
        before = fwd.counts()
        ...                                          # calls through fwd.address
        up, down = fwd.counts_since(before)          # client->server, server->client

A chunk is counted before it is passed on, so once a call has its reply, every byte of its
request and of its reply is in the counts.
"""

from __future__ import annotations

import selectors
import socket
import threading
from typing import Any


class Forwarder:
    """127.0.0.1:*port* -> *target* ("host:port"), every connection piped both ways, in a thread.

    *port* 0 picks a free port (:attr:`port`, :attr:`address`).  :attr:`up` counts the bytes from
    the clients to the target, :attr:`down` those back, over all connections.
    """

    def __init__(self, port: int, target: str):
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self.listener.getsockname()[1]
        host, _, target_port = target.rpartition(":")
        self.target = (host, int(target_port))
        self.up = 0
        self.down = 0
        self.connections = 0
        self._lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``: where clients connect."""
        return f"127.0.0.1:{self.port}"

    def counts(self) -> tuple[int, int]:
        """(bytes client->target, bytes target->client) so far."""
        with self._lock:
            return self.up, self.down

    def counts_since(self, before: tuple[int, int]) -> tuple[int, int]:
        """The bytes each way since *before* (a :meth:`counts`)."""
        up, down = self.counts()
        return up - before[0], down - before[1]

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        upstream: set[socket.socket] = set()  # the client ends: what they send goes up
        while not self.stopped:
            for key, _ in selector.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    inner, _ = sock.accept()
                    try:
                        outer = socket.create_connection(self.target)
                    except OSError:
                        inner.close()
                        continue
                    for end in (inner, outer):
                        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    peers[inner], peers[outer] = outer, inner
                    upstream.add(inner)
                    with self._lock:
                        self.connections += 1
                    selector.register(inner, selectors.EVENT_READ)
                    selector.register(outer, selectors.EVENT_READ)
                    continue
                if sock not in peers:  # closed with its peer earlier in this round
                    continue
                data = b""
                try:
                    data = sock.recv(1 << 20)
                    if data:
                        with self._lock:
                            if sock in upstream:
                                self.up += len(data)
                            else:
                                self.down += len(data)
                        peers[sock].sendall(data)
                except OSError:
                    data = b""
                if not data:  # one side closed: close both
                    other = peers.pop(sock)
                    peers.pop(other, None)
                    for end in (sock, other):
                        upstream.discard(end)
                        selector.unregister(end)
                        end.close()
        for end in peers:
            end.close()
        selector.close()

    def close(self) -> None:
        """Stop the thread, close every connection and the listener."""
        self.stopped = True
        self.thread.join(10)
        self.listener.close()

    def __enter__(self) -> "Forwarder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
