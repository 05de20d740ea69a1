"""close() while a held extent is being proven -- unregistered, then registered again -- never
frees its memory under the server, nor leaves its name registered.

A request given up on (client_timeout) leaves its slot's extent held for the server.  Another
request, waiting for that one slot, proves it: Unregister (refused until the server ends the
first request), then Register again under its name, then ``pool.restore``.  close() runs on
another thread meanwhile (it stopped waiting for that request in flight).

The interleaving is pinned by two hooks that only delay, never change, what is done:

* the prover's re-registration (the driver's Register handler) waits until close()'s own
  unregister of the same name has been answered -- a Register still on the wire;
* close()'s unregister answer reaches close() only once the re-registration was answered (the
  driver-independent ``unregister_now`` close() calls, hooked on the closing thread only).

So at the server: close's Unregister (a no-op: the prover unregistered it already), then the
prover's Register (the server opens the memory and registers the name).  Before, close() then
freed the memory (the server had it open: the fake runtime's freed_while_open); now the pool's
close leaves an extent being registered again to its prover, which lets go of it after
(``SlotPool.start_reregistering``).  Modes ``before_send`` (the Register sent only after close()
returned) and ``answer_late`` (answered after close() returned) held before too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm.client import _client as client_module
from tritonshm.client import _disposal
from tritonshm.client._steps import Register
from tritonshm.errors import ServerTimeout

from support.insides import wrap_step
from triton_fixtures import client_url, registered_regions, wait_until

pytestmark = pytest.mark.server

SLOW = "slow_fp32"
N = 1024


def _extent_bytes(url, x):
    """The bytes of a one-slot pool for *x* (so max_pool_bytes lets the pool never grow)."""
    with tritonshm.Client(url, slots=1, by_reference=False) as probe:
        probe.infer(SLOW, {"INPUT0": x})
        (pool,) = probe.pools()
        return pool.nbytes


class Pin:
    """The two hooks (see the module)."""

    def __init__(self, monkeypatch, closing_thread, aio=False, mode="between"):
        self.mode = mode
        self.closed = threading.Event()  # close() returned (modes "before_send", "answer_late")
        self.target = None
        self.probe = None  # () -> whether the server has the target registered
        self.server_had_it = None  # ... as close() went on to free the memory
        self.at_register = threading.Event()    # the prover's re-registration began
        self.close_unregistered = threading.Event()  # close()'s unregister of the target was answered
        self.registered = threading.Event()     # the prover's re-registration was answered
        self.register_outcome = []
        self.closing_thread = closing_thread
        real = client_module.unregister_now

        def unregister_now(tc, name, headers=None, timeout=None):
            out = real(tc, name, headers=headers, timeout=timeout)
            if self.mode == "between" and name == self.target and threading.current_thread() is self.closing_thread() \
                    and self.at_register.is_set() and not self.close_unregistered.is_set():
                self.close_unregistered.set()
                self.registered.wait(10)  # its answer comes back after the re-registration's
                if self.probe is not None:
                    self.server_had_it = self.probe()
            return out

        def aio_unregister_now(tc, name, headers=None, timeout=None):
            coro = real(tc, name, headers, timeout)

            async def run():
                out = await coro
                if self.mode == "between" and name == self.target and self.at_register.is_set() \
                        and not self.close_unregistered.is_set():
                    self.close_unregistered.set()
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(None, self.registered.wait, 10)
                    if self.probe is not None:
                        self.server_had_it = await loop.run_in_executor(None, self.probe)
                return out
            return run()

        if aio:
            from tritonshm.client import _aio
            monkeypatch.setattr(_aio, "unregister_now", aio_unregister_now)
        monkeypatch.setattr(client_module, "unregister_now", unregister_now)

    def _pinned(self, step) -> bool:
        """Whether *step* is the prover's re-registration of the target (the first one)."""
        return step.name is not None and step.name == self.target and not self.at_register.is_set()

    def _before_register(self) -> None:
        self.at_register.set()
        if self.mode == "between":
            self.close_unregistered.wait(10)  # still on the wire when close() unregisters
        elif self.mode == "before_send":
            self.closed.wait(10)

    def _after_register(self, step) -> None:
        if self.mode == "answer_late":
            self.closed.wait(10)
        self.register_outcome.append("ok")
        if self.mode == "between":  # its answer reaches the prover once close() let go of the memory
            self.registered.set()
            deadline = time.monotonic() + 5
            while not step.memory.closed and time.monotonic() < deadline:
                time.sleep(0.005)

    @contextlib.contextmanager
    def _registering(self):
        """Around the pinned Register: its failure recorded, and its end told, however it ends."""
        try:
            yield
        except BaseException as exc:
            self.register_outcome.append(repr(exc))
            raise
        finally:
            self.registered.set()

    def sync_register(self, register):
        def handler(step):
            if not self._pinned(step):
                return register(step)
            self._before_register()
            with self._registering():
                name = register(step)
                self._after_register(step)
                return name
        return handler

    def aio_register(self, register):
        async def handler(step):
            if not self._pinned(step):
                return await register(step)
            await asyncio.to_thread(self._before_register)
            with self._registering():
                name = await register(step)
                await asyncio.to_thread(self._after_register, step)
                return name
        return handler


def close_while_a_waiter_proves(c, x, pin: Pin, close, **options) -> None:
    """A request waiting for *c*'s one slot, on a thread of its own, proves the extent held for the
    server; ``close()`` is called once its re-registration began; the thread is joined.  (The
    request may fail: the client closed under it.)"""
    def prover():
        try:
            c.infer(SLOW, {"INPUT0": x}, **options)
        except Exception:
            pass  # (ClientClosed and the like: what the test looks at is the memory, and the server)

    thread = threading.Thread(target=prover)
    thread.start()
    assert pin.at_register.wait(10), "the prover never re-registered"
    close()
    pin.closed.set()
    pin.close_unregistered.set()  # (close() left the extent to the prover: nothing more to wait for)
    thread.join(15)
    assert not thread.is_alive()


def assert_let_go(srv, kind: str, name: str, pin: Pin, held_before: set, fake, freed_before: int) -> None:
    """Everything settles: the closed client's name leaves the server, the memory held for it
    goes -- and none of it was freed while the server had it open."""
    wait_until(lambda: name not in registered_regions(srv, kind), 10)
    wait_until(lambda: not [e for e in _disposal.held_for_the_server if id(e) not in held_before], 10)
    freed = fake.stats().freed_while_open - freed_before if fake is not None else 0
    assert not (kind == "cuda" and pin.server_had_it), (
        f"close() went on to cudaFree the CUDA slot {name} while the server had it registered (opened) "
        f"through the prover's re-registration (fake freed_while_open +{freed})")
    assert not freed, (f"close() freed the CUDA slot {name} while the server had it open through the "
                       f"prover's re-registration (prover's Register: {pin.register_outcome})")


def _memory(request, kind):
    if kind == "cuda":
        srv = request.getfixturevalue("fake_cuda_server")
        request.getfixturevalue("fake_cuda")
        x = request.getfixturevalue("torch_caching").from_numpy(np.full(N, 1, np.float32))
    else:
        srv = request.getfixturevalue("server")
        x = np.full(N, 1, np.float32)
    return srv, x


@pytest.mark.parametrize("kind, cancel, mode", [
    ("cuda", False, "between"), ("cuda", True, "between"), ("system", False, "between"),
    ("cuda", False, "before_send"), ("cuda", False, "answer_late"),
], ids=lambda value: {False: "close", True: "close_cancel"}.get(value, value) if isinstance(value, bool) else value)
def test_sync_close_during_reregistration(request, monkeypatch, kind, cancel, mode):
    srv, x = _memory(request, kind)
    url = client_url(srv, "grpc")
    extent = _extent_bytes(url, x)
    main = threading.current_thread()
    pin = Pin(monkeypatch, lambda: main, mode=mode)
    held_before = set(map(id, _disposal.held_for_the_server))
    c = tritonshm.Client(url, slots=1, max_pool_bytes=extent, slot_timeout=2.0, by_reference=False)
    c.infer(SLOW, {"INPUT0": x})
    (pool,) = c.pools()
    (name,) = pool.regions
    pin.target = name
    pin.probe = lambda: name in registered_regions(srv, kind)
    assert name in registered_regions(srv, kind)
    wrap_step(c, Register, pin.sync_register)

    with pytest.raises(ServerTimeout):
        c.infer(SLOW, {"INPUT0": x}, client_timeout=0.1)  # given up on: its extent held for the server
    gc.collect()  # (nothing but the extent holds its memory now: a cycle of the failure's frames may)
    fake = request.getfixturevalue("fake_cuda") if kind == "cuda" else None
    freed_before = fake.stats().freed_while_open if fake is not None else 0
    close_while_a_waiter_proves(c, x, pin, lambda: c.close(cancel_requests=cancel))
    assert_let_go(srv, kind, name, pin, held_before, fake, freed_before)


@pytest.mark.parametrize("kind, mode", [("cuda", "between"), ("system", "between"), ("cuda", "answer_late")])
def test_aio_close_during_reregistration(request, monkeypatch, kind, mode):
    srv, x = _memory(request, kind)
    url = client_url(srv, "grpc")
    extent = _extent_bytes(url, x)
    holder = {}
    pin = Pin(monkeypatch, lambda: holder.get("thread"), aio=True, mode=mode)
    fake = request.getfixturevalue("fake_cuda") if kind == "cuda" else None
    freed_before = fake.stats().freed_while_open if fake is not None else 0

    async def main() -> str:
        holder["thread"] = threading.current_thread()
        c = tritonshm.aio.Client(url, slots=1, max_pool_bytes=extent, slot_timeout=2.0, by_reference=False)
        await c.infer(SLOW, {"INPUT0": x})
        (pool,) = c.pools()
        (name,) = pool.regions
        pin.target = name
        pin.probe = lambda: name in registered_regions(srv, kind)
        wrap_step(c, Register, pin.aio_register)
        with pytest.raises(ServerTimeout):
            await c.infer(SLOW, {"INPUT0": x}, client_timeout=0.1)
        gc.collect()

        async def prover():
            try:
                await c.infer(SLOW, {"INPUT0": x})
            except Exception:
                pass  # (ClientClosed and the like: what the test looks at is the memory, and the server)

        task = asyncio.ensure_future(prover())
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, pin.at_register.wait, 10)
        await c.close()
        pin.closed.set()
        pin.close_unregistered.set()  # (close() left the extent to the prover: nothing more to wait for)
        await asyncio.wait_for(task, 15)
        return name

    held_before = set(map(id, _disposal.held_for_the_server))
    name = asyncio.run(main())
    assert_let_go(srv, kind, name, pin, held_before, fake, freed_before)


@pytest.mark.parametrize("kind", ["cuda", "system"])
def test_sync_reregistration_answered_late_after_close(request, monkeypatch, kind):
    """As ``between``, but the prover's request has a client_timeout (its calls are bounded), and
    the re-registration's answer comes after it: ServerTimeout, though the server registered it
    (after close()'s unregister).  _prove_steps reads a ServerError as "unreachable: ask again
    later" and puts the extent back in the proving list -- which nobody reads after close()."""
    srv, x = _memory(request, kind)
    url = client_url(srv, "grpc")
    extent = _extent_bytes(url, x)
    main = threading.current_thread()
    pin = Pin(monkeypatch, lambda: main, mode="between")
    c = tritonshm.Client(url, slots=1, max_pool_bytes=extent, slot_timeout=2.0, by_reference=False)
    c.infer(SLOW, {"INPUT0": x})
    (pool,) = c.pools()
    (name,) = pool.regions
    pin.target = name
    with pytest.raises(ServerTimeout):
        c.infer(SLOW, {"INPUT0": x}, client_timeout=0.1)  # given up on: its extent held for the server
    gc.collect()

    real_register = c._driver._register  # (bounded calls go to the driver's own _register)

    def late_register(step, bound=None):
        if step.name != name or pin.at_register.is_set():
            return real_register(step, bound)
        pin.at_register.set()
        pin.close_unregistered.wait(10)
        try:
            real_register(step, bound)  # the server registered it ...
            pin.register_outcome.append("registered")
        finally:
            pin.registered.set()
        raise ServerTimeout(f"registering {name!r}: the server did not answer within {bound.seconds():g} s")

    c._driver._register = late_register
    fake = request.getfixturevalue("fake_cuda") if kind == "cuda" else None
    freed_before = fake.stats().freed_while_open if fake is not None else 0
    close_while_a_waiter_proves(c, x, pin, c.close, client_timeout=5.0)
    deadline = time.monotonic() + 10
    while name in registered_regions(srv, kind) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = name in registered_regions(srv, kind)
    freed_while_open = fake.stats().freed_while_open - freed_before if fake is not None else 0
    del c, x, real_register, late_register
    gc.collect()
    if left:  # (clean up the shared server after the finding)
        from triton_fixtures import make_client
        _, tc = make_client(srv, "grpc")
        try:
            getattr(tc, f"unregister_{kind}_shared_memory")(name)
        finally:
            tc.close()
    assert not left, f"{name} still registered on the server 10 s after close()"
    assert not freed_while_open, "the closed client's CUDA slot was freed while the server had it open"
