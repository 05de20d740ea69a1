"""Every way a request ends, one rule (issue 38): what the server may still read or write -- a
slot, the caller's ``out=`` -- comes back at once when the request never reached the server or
the server answered, and only once the server provably let go of it when the outcome is
unknown (a timeout, a gateway's 504, a connection lost): never before, and never "never".

``slow_fp32`` answers 500 ms after it is asked, one request at a time, so a client that gives
up at 0.1 s leaves the server running the request.  The clients here have one slot and no
room to grow (``max_pool_bytes`` of one extent): a slot held for ever would starve them, and one
handed back too early would be leased again while the server still writes it.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import threading
import time

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm.errors import OUTCOMES, Outcome, ServerError, ServerTimeout, outcome_of
from triton_fixtures import client_url

SLOW = "slow_fp32"  # answers 500 ms after it is asked
GIVE_UP = 0.1


def x_of(value: float) -> np.ndarray:
    return np.full(4, value, np.float32)


def one_slot_client(url: str, aio: bool = False, **settings):
    """A client of one slot that cannot grow: its pool's one extent is all max_pool_bytes allows."""
    with tritonshm.Client(url, slots=1) as probe:
        probe.infer(SLOW, {"INPUT0": x_of(0)})
        (pool,) = probe.pools()
        extent = pool.nbytes
    cls = tritonshm.aio.Client if aio else tritonshm.Client
    return cls(url, slots=1, max_pool_bytes=extent, slot_timeout=30, **settings)


def give_up_options(protocol: str, aio: bool = False) -> tuple[dict, dict]:
    """(the client's settings, a call's options) that make it give up on a slow_fp32 request:
    gRPC's per-call client_timeout; over HTTP, the connection's network_timeout (tritonclient.http's
    name; tritonclient.http.aio's is conn_timeout)."""
    if protocol == "grpc":
        return {}, {"client_timeout": GIVE_UP}
    return {"connect_options": {"conn_timeout" if aio else "network_timeout": GIVE_UP}}, {}


def awaiting(client) -> int:
    return sum(p.awaiting_server for p in client.pools())


def shm_segments() -> set[str]:
    import os

    return {name for name in os.listdir("/dev/shm") if name.startswith(f"tritonshm-{os.getpid()}-")}


# -- the one table ---------------------------------------------------------------------------


@pytest.mark.parametrize("status, message, outcome", [
    ("StatusCode.UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                               "Failed to connect to remote host: Connection refused", Outcome.NOT_SENT),
    ("StatusCode.UNAVAILABLE", "DNS resolution failed for nohost:8001: C-ares status is not ARES_SUCCESS",
     Outcome.NOT_SENT),
    ("StatusCode.UNAVAILABLE", "Socket closed", Outcome.UNKNOWN),
    ("StatusCode.UNAVAILABLE", "Received http2 header with status: 504", Outcome.UNKNOWN),  # a proxy's
    ("StatusCode.UNAVAILABLE", "Server not ready", Outcome.UNKNOWN),  # Triton's, but shares the status
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", Outcome.UNKNOWN),
    ("StatusCode.CANCELLED", "Locally cancelled by application!", Outcome.UNKNOWN),
    ("StatusCode.INTERNAL", "Received RST_STREAM with error code 2", Outcome.UNKNOWN),
    ("StatusCode.UNKNOWN", "Stream removed", Outcome.UNKNOWN),
    ("StatusCode.INTERNAL", "Failed to process the request(s) for model 'm', message: boom", Outcome.ANSWERED),
    ("StatusCode.INVALID_ARGUMENT", "unexpected shape for input 'INPUT0'", Outcome.ANSWERED),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'm' is not found", Outcome.ANSWERED),
    ("504", "HTTP 504: b'upstream request timeout'", Outcome.UNKNOWN),  # tritonclient.http's
    ("400", "unexpected shape", Outcome.ANSWERED),
])
def test_the_table_reads_where_a_failure_happened(status, message, outcome):
    assert outcome_of(ServerError(f"inferring with model 'm': {message}", status=status)) is outcome
    assert any(rule.outcome is outcome for rule in OUTCOMES)


def test_failures_with_no_status_are_unknown_unless_the_wire_said():
    assert outcome_of(ServerTimeout("no answer within network_timeout")) is Outcome.UNKNOWN
    assert outcome_of(tritonshm.ClientClosed("closed")) is Outcome.UNKNOWN
    assert outcome_of(asyncio.CancelledError()) is Outcome.UNKNOWN
    said = tritonshm.ServerUnavailable("cannot reach the Triton server")
    said.outcome = Outcome.NOT_SENT
    assert outcome_of(said) is Outcome.NOT_SENT


# -- given up on, then served ----------------------------------------------------------------


async def _served_again(client, protocol: str, aio: bool = False) -> None:
    """The server finished what the client gave up on: the slot serves again (a lease waiting
    for it asks the server; over HTTP, where the connection's network_timeout is shorter than
    slow_fp32, the slot is leased rather than run)."""
    leased = client.request(SLOW, shapes={"INPUT0": [4]}, slot_timeout=30)
    with (await leased if aio else leased):
        assert awaiting(client) == 0
    if protocol == "grpc":
        out = client.infer(SLOW, {"INPUT0": x_of(7)})
        np.testing.assert_array_equal((await out if aio else out)["OUTPUT0"], x_of(7))


@pytest.mark.server
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_one_slot_survives_requests_given_up_on(server, protocol, aio):
    """Each request given up on waits for the one before it to end on the server (the one slot
    comes back only then), then is given up on in turn; the slot serves once the last ended.
    (Held for ever before: the second request raised PoolExhausted.  The asyncio client's lease
    then waited out its slot_timeout: the slot the server let go of woke nobody.)"""
    settings, call = give_up_options(protocol, aio)
    before = shm_segments()

    async def main() -> None:
        c = one_slot_client(client_url(server, protocol), aio=aio, **settings)
        for i in range(20):
            began = time.monotonic()
            with pytest.raises(tritonshm.ServerTimeout):
                done = c.infer(SLOW, {"INPUT0": x_of(100 + i)}, **call)
                await done if aio else done
            assert awaiting(c) == 1  # the server still runs it: its slot is held for it
            assert time.monotonic() - began < 10  # (its wait for the slot: about the 0.5 s the server takes)
        await _served_again(c, protocol, aio)
        assert len(c.pools()[0].regions) == 1
        await c.close() if aio else c.close()

    asyncio.run(main())
    assert shm_segments() == before


@pytest.mark.server
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_a_lease_already_waiting_for_the_slot_gets_it_once_the_server_let_go(server, protocol, aio):
    """A lease waits for the one slot while the request on it is given up on: holding the slot for
    the server wakes the lease, which asks the server, and has the slot once it let go.  (Before,
    nothing woke it -- it had gone to sleep for its whole slot_timeout, while nothing was held --
    and asked only then; a request in its place raised PoolExhausted, "0 running, 0 held, 1
    awaiting the server".)"""
    settings, call = give_up_options(protocol, aio)
    shapes = {"INPUT0": [4]}

    async def main() -> None:
        c = one_slot_client(client_url(server, protocol), aio=aio, **settings)
        try:
            if aio:
                await c.model_info(SLOW)
                given_up = asyncio.ensure_future(c.infer(SLOW, {"INPUT0": x_of(1)}, **call))
                await asyncio.sleep(0.05)  # (it has the slot: the lease below waits for it)
                began = time.monotonic()
                leasing = asyncio.ensure_future(c.request(SLOW, shapes=shapes, slot_timeout=30))
                with pytest.raises(ServerTimeout):
                    await given_up
                with await leasing:
                    waited = time.monotonic() - began
            else:
                c.model_info(SLOW)
                failures: list[BaseException] = []

                def give_up() -> None:
                    try:
                        c.infer(SLOW, {"INPUT0": x_of(1)}, **call)
                    except BaseException as exc:
                        failures.append(exc)

                thread = threading.Thread(target=give_up)
                thread.start()
                time.sleep(0.05)
                began = time.monotonic()
                with c.request(SLOW, shapes=shapes, slot_timeout=30):
                    waited = time.monotonic() - began
                thread.join()
                assert len(failures) == 1 and isinstance(failures[0], ServerTimeout)
            assert waited < 15  # (about the 0.5 s the server takes; its whole slot_timeout, before)
        finally:
            await c.close() if aio else c.close()

    asyncio.run(main())


# -- refused while the server is down, then served after a restart ---------------------------


@pytest.mark.server
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_one_slot_survives_a_server_down_and_restarted(fresh_server, protocol, aio):
    """Requests refused with "connection refused" never reached the server: their slot is back
    at once (it was held for ever: every later request raised PoolExhausted)."""
    url = client_url(fresh_server, protocol)

    async def run(coro_or_value):
        return await coro_or_value if aio else coro_or_value

    async def main() -> None:
        c = one_slot_client(url, aio=aio)
        np.testing.assert_array_equal((await run(c.infer(SLOW, {"INPUT0": x_of(1)})))["OUTPUT0"], x_of(1))
        fresh_server.stop()
        for i in range(20):
            with pytest.raises(tritonshm.ServerUnavailable):
                await run(c.infer(SLOW, {"INPUT0": x_of(i)}))
            assert awaiting(c) == 0  # it never reached a server
        fresh_server.start()  # the same ports; it knows none of our regions
        deadline = time.monotonic() + 30
        while True:  # (a gRPC channel reconnects on a backoff of its own: a service retries)
            try:
                out = await run(c.infer(SLOW, {"INPUT0": x_of(2)}))
                break
            except tritonshm.ServerUnavailable:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        np.testing.assert_array_equal(out["OUTPUT0"], x_of(2))
        if aio:
            await c.close()
        else:
            c.close()

    asyncio.run(main())


@pytest.mark.server
def test_a_slot_given_up_on_comes_back_after_a_restart(fresh_server, protocol):
    settings, call = give_up_options(protocol)
    with one_slot_client(client_url(fresh_server, protocol), **settings) as c:
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer(SLOW, {"INPUT0": x_of(2)}, **call)
        assert awaiting(c) == 1
        fresh_server.restart()  # holds nothing of ours any more
        asyncio.run(_served_again(c, protocol))


# -- the zero-copy request -------------------------------------------------------------------


@pytest.mark.server
def test_running_a_zero_copy_request_again_waits_for_the_server(server):
    with tritonshm.Client(server.grpc_url, slots=1, slot_timeout=0.05) as c:
        with c.request(SLOW, shapes={"INPUT0": [4]}) as req:
            req.inputs["INPUT0"][:] = 5
            with pytest.raises(tritonshm.ServerTimeout):
                req.run(client_timeout=GIVE_UP)
            # the server still runs it, and may write the slot: not sent again into it
            with pytest.raises(tritonshm.TensorInUse, match="given up on in its last run"):
                req.run()
            time.sleep(0.6)  # the server is done with it by now
            np.testing.assert_array_equal(req.run()["OUTPUT0"], x_of(5))


@pytest.fixture
def no_collector():
    """Only reference counts free memory meanwhile: a slot kept by a reference cycle -- until the
    garbage collector happens to run, which a steady service may not do for minutes -- shows."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.server
def test_two_runs_of_a_request_given_up_on_count_its_slot_running_once(server):
    """Two threads run one request after a run given up on: both wait for the server to let go
    of the slot, then run; the slot counts as running once.  (Both counted it: the pool said
    running=1, held=-1 for ever, and the next request given up on lost the client's one slot
    for good -- PoolExhausted with the server idle.)"""
    c = one_slot_client(server.grpc_url)
    try:
        request = c.request(SLOW, shapes={"INPUT0": (4,)})
        request.inputs["INPUT0"][:] = 1
        with pytest.raises(ServerTimeout):
            request.run(client_timeout=GIVE_UP)
        ends: list = []

        def run() -> None:
            try:
                ends.append(request.run()["OUTPUT0"].copy())
            except tritonshm.Error as exc:
                ends.append(exc)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [type(end).__name__ for end in ends] == ["ndarray", "ndarray"], ends
        request.close()
        del request, ends
        gc.collect()
        (pool,) = c.pools()
        assert (pool.running, pool.held) == (0, 0)
        with pytest.raises(ServerTimeout):  # its slot held for the server once more ...
            c.infer(SLOW, {"INPUT0": x_of(2)}, client_timeout=GIVE_UP)
        np.testing.assert_array_equal(c.infer(SLOW, {"INPUT0": x_of(3)})["OUTPUT0"], x_of(3))  # ... and back
    finally:
        c.close()


@pytest.mark.server
def test_a_zero_copy_request_given_up_on_and_closed_leaves_nothing_holding_its_slot(server, no_collector):
    """The failure's traceback held the driver's frame, and the frame the failure: a cycle that
    kept the request's lease, and the client's one slot, until a garbage collection (the next
    request waited its slot_timeout and raised PoolExhausted, "1 held")."""
    with one_slot_client(server.grpc_url) as c:
        with c.request(SLOW, shapes={"INPUT0": [4]}) as req:
            req.inputs["INPUT0"][:] = 5
            with pytest.raises(tritonshm.ServerTimeout):
                req.run(client_timeout=GIVE_UP)
        with c.request(SLOW, shapes={"INPUT0": [4]}, slot_timeout=5) as again:  # once the server is done
            again.inputs["INPUT0"][:] = 6
            np.testing.assert_array_equal(again.run()["OUTPUT0"], x_of(6))


@pytest.mark.server
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_a_failed_request_leaves_nothing_holding_its_slot(server, aio, no_collector):
    """Triton's own error (a queue timeout) ends a request whose results would have been views
    (``copy=False``): its slot is back at once, though the caller keeps the failure (whose
    traceback keeps the request's frames, its lease among them) and no garbage collection runs."""
    x = np.ones((1, 4), np.float32)

    async def main() -> None:
        cls = tritonshm.aio.Client if aio else tritonshm.Client
        c = cls("http://" + server.http_url, slots=2)

        async def run(coro_or_value):
            return await coro_or_value if aio else coro_or_value

        await run(c.infer("echo_request", {"INPUT0": x}))
        busy = (asyncio.ensure_future(c.infer("echo_request", {"INPUT0": x}, parameters={"delay_ms": 400}))
                if aio else c.infer_async("echo_request", {"INPUT0": x}, parameters={"delay_ms": 400}))
        await asyncio.sleep(0.1)  # it holds the model's one instance: the next one queues
        with pytest.raises(tritonshm.ServerError, match="(?i)timeout expired") as kept:
            await run(c.infer("echo_request", {"INPUT0": x}, timeout=1, copy=False))
        (pool,) = c.pools()
        assert pool.held == 0 and kept.value.__traceback__ is not None
        await busy if aio else busy.result()
        await run(c.close())

    asyncio.run(main())


# -- a gateway's 504 -------------------------------------------------------------------------


class GatewayThatGivesUp:
    """An HTTP/1.1 stand-in for a proxy in front of Triton: it forwards every call, but answers
    the first inference request 504 at once while Triton goes on running it."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.gave_up = 0
        self.armed = False  # give up on the next inference request
        self.reset_next = False  # reset the connection of the next one, once it is forwarded
        self._upstream_threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_message(sock: socket.socket, buffer: bytearray) -> bytes | None:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            rest += chunk
        buffer[:] = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream) as up:
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            up.sendall(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body)
            answer = bytearray()
            while chunk := up.recv(65536):
                answer += chunk
        head, _, body = bytes(answer).partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:",
                                                                                      b"transfer-encoding:"))]
        if not any(line.lower().startswith(b"content-length:") for line in lines):
            lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def _serve(self, conn: socket.socket) -> None:
        buffer = bytearray()
        with conn:
            while (request := self._read_message(conn, buffer)) is not None:
                if b"/infer " in request.split(b"\r\n", 1)[0] and self.armed:
                    self.armed = False
                    self.gave_up += 1
                    thread = threading.Thread(target=self._forward, args=(request,), daemon=True)
                    thread.start()  # Triton runs it; its answer is dropped
                    self._upstream_threads.append(thread)
                    body = b"upstream request timeout"
                    conn.sendall(b"HTTP/1.1 504 Gateway Timeout\r\nContent-Type: text/plain\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                if b"/infer " in request.split(b"\r\n", 1)[0] and self.reset_next:
                    self.reset_next = False
                    thread = threading.Thread(target=self._forward, args=(request,), daemon=True)
                    thread.start()  # Triton runs it; its answer is dropped
                    self._upstream_threads.append(thread)
                    time.sleep(0.1)  # (it reached Triton)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # closed with a reset: no byte of an answer
                conn.sendall(self._forward(request))

    def close(self) -> None:
        self.listener.close()
        for thread in self._upstream_threads:
            thread.join(5)


@pytest.mark.server
def test_a_gateways_504_is_no_answer_from_triton(server):
    """A 504 from a proxy came before Triton finished: the slot stays held for the server (it was
    handed back, and the next request's slot got Triton's late write)."""
    gateway = GatewayThatGivesUp(server.http_url)
    try:
        with one_slot_client(gateway.url) as c:
            c.infer(SLOW, {"INPUT0": x_of(1)})
            gateway.armed = True
            with pytest.raises(tritonshm.ServerError, match="504") as caught:
                c.infer(SLOW, {"INPUT0": x_of(800)})
            assert outcome_of(caught.value) is Outcome.UNKNOWN and gateway.gave_up == 1
            assert awaiting(c) == 1
            np.testing.assert_array_equal(c.infer(SLOW, {"INPUT0": x_of(2)})["OUTPUT0"], x_of(2))
            assert awaiting(c) == 0
    finally:
        gateway.close()


@pytest.mark.server
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_a_request_sent_again_after_a_reset_is_held_for_the_server(server, aio):
    """A kept connection reset before any byte of an answer: the request goes out again on a
    fresh one (most likely the server closed the connection unread) -- but a proxy had forwarded
    the first copy, which Triton runs too, and may still write the slot after the second's
    answer (with more than one instance).  The slot is held until the server provably let go
    (it was back at once: nothing asked the server)."""
    from support.insides import wrap_step
    from tritonshm.client._steps import Unregister

    gateway = GatewayThatGivesUp(server.http_url)
    asked: list[str] = []

    def watched(unregister):
        def handler(step):
            asked.append(step.name)
            return unregister(step)
        return handler

    async def main() -> None:
        c = one_slot_client(gateway.url, aio=aio)
        wrap_step(c, Unregister, watched)
        first = c.infer(SLOW, {"INPUT0": x_of(1)})  # (its connection is kept)
        await first if aio else first
        gateway.reset_next = True
        answer = c.infer(SLOW, {"INPUT0": x_of(5)})
        np.testing.assert_array_equal((await answer if aio else answer)["OUTPUT0"], x_of(5))
        assert len(gateway._upstream_threads) == 1  # (the first copy went to Triton)
        assert asked == list(c.pools()[0].regions)  # the slot was held, and the server asked about it
        answer = c.infer(SLOW, {"INPUT0": x_of(2)})
        np.testing.assert_array_equal((await answer if aio else answer)["OUTPUT0"], x_of(2))
        assert awaiting(c) == 0
        await c.close() if aio else c.close()

    try:
        asyncio.run(main())
    finally:
        gateway.close()


@pytest.mark.server
def test_tritons_own_http_error_is_its_answer(server):
    """Triton's 503 with its JSON error body (a request that timed out in the model's queue) is
    the server's answer: the slot is back at once."""
    with tritonshm.Client("http://" + server.http_url, slots=2) as c:
        x = np.ones((1, 4), np.float32)
        c.infer("echo_request", {"INPUT0": x})
        busy = c.infer_async("echo_request", {"INPUT0": x}, parameters={"delay_ms": 400})
        time.sleep(0.1)  # it holds the model's one instance: the next one queues
        with pytest.raises(tritonshm.ServerError, match="(?i)timeout expired") as caught:
            c.infer("echo_request", {"INPUT0": x}, timeout=1)
        assert caught.value.status() == "503" and outcome_of(caught.value) is Outcome.ANSWERED
        assert awaiting(c) == 0
        busy.result()


# -- an out= copied from a slot ----------------------------------------------------------------


@pytest.mark.server
def test_a_copied_out_of_the_right_size_takes_a_variable_output_larger_than_the_slots_guess(
        fake_cuda_server, fake_cuda, torch_caching):
    """``by_reference=False``: the out= tensor is not the room the server writes, the slot is; the
    slot's guess for tile_fp32's output (as large as the input) was short, not out= (it was
    refused: "made output 'OUTPUT0' of 8000 bytes, but out['OUTPUT0'] holds 8000 bytes")."""
    x = torch_caching.from_numpy(np.arange(1000, dtype=np.float32))
    y = torch_caching.empty(2000, np.float32)  # tile_fp32 returns the input twice
    with tritonshm.Client(fake_cuda_server.grpc_url, by_reference=False) as c:
        out = c.infer("tile_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        assert out["OUTPUT0"] is y
        np.testing.assert_array_equal(y.numpy(), np.tile(np.arange(1000, dtype=np.float32), 2))
    del x, y


# -- a server older than 2.50: nothing it says proves it done --------------------------------


@pytest.mark.parametrize("version, held", [("2.49.0", True), ("2.45.0", True), ("1.9.0", True),
                                           ("2.50.0", False), ("2.51.0", False), ("2.53.0dev", False),
                                           ("", False), ("unknown", False)])
def test_what_the_servers_version_says_about_its_answers(version, held):
    from tritonshm.client._disposal import Disposals

    disposals = Disposals(0, old_server_hold=7.0)
    disposals.server_is(version)
    assert disposals.hold == (7.0 if held else 0.0)


def _claims_to_be(version: str, monkeypatch) -> None:
    """The server (Triton 2.51 here) says it is *version*: a stand-in for an older release."""
    from tritonshm.client._client import BlockingDriver

    monkeypatch.setattr(BlockingDriver, "_fetch_server_version", lambda self, step, bound=None: version)


@pytest.mark.server
def test_on_a_server_older_than_2_50_a_slot_given_up_on_is_held_old_server_hold(fresh_server, monkeypatch):
    """Before 2.50 Triton unregisters a region a running request uses at once, so the proof
    proves nothing: the slot is held old_server_hold seconds (one warning says so), and comes back
    at once when the server is seen to restart."""
    _claims_to_be("2.49.0", monkeypatch)
    with one_slot_client(fresh_server.grpc_url, old_server_hold=3.0) as c:
        with pytest.warns(RuntimeWarning, match="old_server_hold=3.0"):
            with pytest.raises(tritonshm.ServerTimeout):
                c.infer(SLOW, {"INPUT0": x_of(1)}, client_timeout=GIVE_UP)
            given_up = time.monotonic()
            np.testing.assert_array_equal(c.infer(SLOW, {"INPUT0": x_of(2)})["OUTPUT0"], x_of(2))
        assert time.monotonic() - given_up >= 3.0  # not at ~0.5 s, when the server said it let go
        with pytest.raises(tritonshm.ServerTimeout):  # no second warning
            c.infer(SLOW, {"INPUT0": x_of(3)}, client_timeout=GIVE_UP)
        fresh_server.restart()
        restarted = time.monotonic()
        deadline = restarted + 30
        while True:  # (the channel reconnects on a backoff of its own)
            try:
                out = c.infer(SLOW, {"INPUT0": x_of(4)})
                break
            except tritonshm.ServerUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        np.testing.assert_array_equal(out["OUTPUT0"], x_of(4))
        assert awaiting(c) == 0


# -- what the server refuses after close() gave up ----------------------------------------------


class _Memory:
    """An extent's memory as the disposals see it: its kind, and closing it."""

    def __init__(self, kind: str):
        self.kind, self.closed = kind, False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("kind, held", [("cuda", True), ("system", False)])
def test_what_the_server_refuses_after_close_gave_up_is_held_or_closed_not_left_parked(kind, held):
    """close() gives up on what the server still refuses (held for the process, or closed), but a
    request close() stopped waiting for may end later and let go of its slot then: refused at
    that moment, the slot's extent was parked where nobody asks again, and its memory was freed
    by the garbage collector whenever the engine died (CI saw the ResourceWarning).  Sans I/O:
    the unregister is answered by hand."""
    import os

    from tritonshm.client._disposal import Disposals, held_for_the_server
    from tritonshm.client._pool import Extent
    from tritonshm.client._steps import Unregister

    disposals = Disposals(os.getpid())
    disposals.give_up()  # the client closed
    extent = Extent(_Memory(kind), 1)
    extent.name = "tritonshm-refused-after-close"
    steps = disposals.drop_steps(extent)
    assert isinstance(next(steps), Unregister)
    refusal = ServerError("failed to unregister: currently in use", status="StatusCode.INTERNAL")
    with pytest.raises(StopIteration):
        steps.throw(refusal)  # (not unreachable: the server is there, and says no)
    try:
        assert disposals.parked == []
        assert (extent in held_for_the_server, extent.memory.closed) == (held, not held)
    finally:
        if extent in held_for_the_server:
            held_for_the_server.remove(extent)


def test_close_keeps_asking_while_a_request_it_stopped_waiting_for_asks_too():
    """close() asks the server again, for a while, to unregister what it refused; a request that
    close() stopped waiting for ends meanwhile and asks about the same parked extents (any thread
    may: the list is taken whole).  close()'s asking used to end at once -- nothing parked just
    then -- and the request's refused extent was parked after close() gave up: never asked again
    (CI: test_close_that_stops_waiting_holds_what_the_server_still_uses[0.3]).  Sans I/O: each
    unregister answered by hand."""
    import os

    from tritonshm.client._disposal import Disposals
    from tritonshm.client._pool import Extent
    from tritonshm.client._steps import Pause, Unregister

    refusal = ServerError("failed to unregister: currently in use", status="StatusCode.INTERNAL")
    disposals = Disposals(os.getpid())
    extent = Extent(_Memory("cuda"), 1)
    extent.name = "tritonshm-asked-twice"
    first = disposals.drop_steps(extent)  # close(): refused while the request runs
    next(first)
    with pytest.raises(StopIteration):
        first.throw(refusal)
    assert disposals.parked == [extent]
    request = disposals.retry_steps()  # the request ended, and asks about what is parked
    assert isinstance(next(request), Unregister)
    settle = disposals.settle_steps(5.0)  # close() asks again meanwhile
    assert isinstance(next(settle), Pause)  # (it ended here, with nothing parked just then)
    with pytest.raises(StopIteration):
        request.throw(refusal)  # refused: the server answers a request before it lets go
    assert disposals.parked == [extent]
    step = settle.send(None)  # after the pause: close() asks, and the server lets go now
    assert isinstance(step, Unregister) and step.name == extent.name
    with pytest.raises(StopIteration):
        settle.send(None)
    assert extent.memory.closed and disposals.parked == []
