"""What a closing client leaves with a server that still uses it comes back once the server lets go.

``close()`` waits for requests in flight (up to *slot_timeout*), then asks the
server for a while (up to min(slot_timeout, 5 s)) to unregister everything.
Device memory a request it stopped waiting for still uses -- its CUDA slot,
the caller's tensors it lent -- is then held, never freed under the server;
and asked about again on a backoff after ``close()`` returned, until the
server lets go of it, when it is freed: never "never".  On the FAKE CUDA
runtime against a real Triton, which catches memory freed under the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time

import numpy as np
import pytest

import tritonshm
from tritonshm.client import _disposal

from support.deferring_triton import DeferringUnregisters
from triton_fixtures import client_url, registered_regions, wait_until

pytestmark = pytest.mark.server

N = 16384  # floats: 64 KiB, a block of a 2 MiB segment of the caching double
SLOW = 0.5  # slow_fp32's delay


@pytest.mark.parametrize("protocol, server_release", [("grpc", "2.51"), ("http", "2.51"), ("grpc", "2.53")])
@pytest.mark.parametrize("by_reference", [True, False], ids=["lent", "slot"])
def test_memory_held_when_the_client_closed_comes_back_once_the_server_let_go(
        fake_cuda_server, torch_caching, monkeypatch, protocol, server_release, by_reference):
    deferring = DeferringUnregisters(fake_cuda_server).install(monkeypatch) if server_release == "2.53" else None
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    before = set(map(id, _disposal.held_for_the_server))
    c = tritonshm.Client(client_url(fake_cuda_server, protocol), slot_timeout=0.1, by_reference=by_reference)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        c.model_info("slow_fp32")
        running = pool.submit(c.infer, "slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        time.sleep(0.2)  # (on the server now: it reads x, or the slot, and writes y, or the slot, at 0.5 s)
        c.close()  # stops waiting for it after 0.1 s, asks the server for 0.1 s more
        held = [e for e in _disposal.held_for_the_server if id(e) not in before]
        assert held and not any(e.memory.closed for e in held)  # the server still uses it: held
        concurrent.futures.wait([running])
    # ... and let go of once the server did (it removed the region when the request ended)
    wait_until(lambda: not any(e in _disposal.held_for_the_server for e in held), 10)
    assert all(e.memory.closed for e in held)
    if by_reference:  # the lent tensors' blocks were held with the registration: no longer
        del x, y, running
        gc.collect()
        assert torch_caching.empty_cache() > 0
    if deferring is not None:
        deferring.stop()


@pytest.mark.parametrize("protocol, server_release", [("grpc", "2.51"), ("http", "2.51"), ("grpc", "2.53")])
def test_a_host_region_the_closing_client_stopped_waiting_for_is_unregistered_once_the_server_let_go(
        server, monkeypatch, protocol, server_release):
    """Host memory is closed (unlinked) at once -- the server's mapping stays valid -- but its
    registration is asked about after the close as device memory is: else the server keeps it,
    and its mapping of the unlinked pages, until it restarts."""
    deferring = DeferringUnregisters(server).install(monkeypatch) if server_release == "2.53" else None
    c = tritonshm.Client(client_url(server, protocol), slot_timeout=0.1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        c.model_info("slow_fp32")
        running = pool.submit(c.infer, "slow_fp32", {"INPUT0": np.ones(4, np.float32)})
        time.sleep(0.2)  # (on the server now: it answers at 0.5 s)
        names = {name for pool_ in c.pools() for name in pool_.regions}
        c.close()  # stops waiting for it after 0.1 s, asks the server for 0.1 s more
        assert names & registered_regions(server), "the request should still hold its region"
        concurrent.futures.wait([running])
    wait_until(lambda: not names & registered_regions(server), 10)
    if deferring is not None:
        deferring.stop()


def test_an_aio_client_closed_under_a_request_lets_go_of_its_slot_once_the_server_did(fake_cuda_server,
                                                                                       torch_caching):
    """The asyncio client's close() holds and asks the same way (through a blocking connection
    of its own, as its finalizer's)."""
    import tritonshm.aio

    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    before = set(map(id, _disposal.held_for_the_server))

    async def main() -> list:
        c = tritonshm.aio.Client(client_url(fake_cuda_server, "grpc"), slot_timeout=0.1, by_reference=False)
        await c.model_info("slow_fp32")
        running = asyncio.ensure_future(c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}))
        await asyncio.sleep(0.2)
        await c.close()
        held = [e for e in _disposal.held_for_the_server if id(e) not in before]
        assert held and not any(e.memory.closed for e in held)
        await asyncio.gather(running, return_exceptions=True)
        return held

    held = asyncio.run(main())
    wait_until(lambda: not any(e in _disposal.held_for_the_server for e in held), 10)
    assert all(e.memory.closed for e in held)
    del x, y


@pytest.mark.parametrize("memory", ["system", "cuda"])
def test_an_aio_close_whose_caller_was_cancelled_still_lets_go_of_everything(request, memory):
    """close() cancelled while it waits for a request in flight (a shutdown deadline:
    ``asyncio.wait_for``) finishes all the same: the regions are unregistered once the request
    ended, and a CUDA slot is freed only after that.  (Before, the cancelled close() had let go of
    its finalizer and the second one returned at once: the regions stayed registered until the
    server restarted, and the collected client freed its CUDA slot under the server.)"""
    import tritonshm.aio

    x = np.full(1024, 7, np.float32)
    if memory == "system":
        srv = request.getfixturevalue("server")
    else:  # (the fake CUDA runtime's leak check fails the test if a slot is freed under the server)
        srv = request.getfixturevalue("fake_cuda_server")
        x = request.getfixturevalue("torch_caching").from_numpy(x)

    async def main() -> set[str]:
        c = tritonshm.aio.Client(client_url(srv, "grpc"), slots=1, by_reference=False)
        await c.infer("slow_fp32", {"INPUT0": x})
        names = {name for pool in c.pools() for name in pool.regions}
        assert names and names <= registered_regions(srv, memory)
        busy = asyncio.ensure_future(c.infer("slow_fp32", {"INPUT0": x}))
        await asyncio.sleep(0.1)  # (on the server now)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.close(), 0.05)
        await asyncio.gather(busy, return_exceptions=True)
        await c.close()  # waits for the first one's work
        assert not names & registered_regions(srv, memory)
        return names

    names = asyncio.run(main())
    gc.collect()
    assert not names & registered_regions(srv, memory)


def test_a_forked_child_neither_inherits_the_asking_thread_nor_its_lock():
    """The asking thread is the parent's: a child forked while it asks (its lock held) starts its
    own for its own clients, and asks nothing about its parent's names."""
    import os

    with _disposal._held_lock:  # (as the parent's asking thread may hold it at the fork)
        _disposal._asking, was = threading.current_thread(), _disposal._asking
        try:
            pid = os.fork()
            if pid == 0:  # the child: exit status 0 when it could take the lock and would start a thread
                ok = _disposal._held_lock.acquire(timeout=1) and _disposal._asking is None
                os._exit(0 if ok and not _disposal._after_close else 1)
        finally:
            _disposal._asking = was
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


_EXIT_SCRIPT = """
import sys, threading, time
import numpy as np
import tritonshm

url, mode = sys.argv[1], sys.argv[2]
from tritonshm import triton
from tritonshm.errors import ServerError

def refusing(client, name, **kwargs):  # a server that never lets go: asked about for ever
    raise ServerError(f"unregistering {name!r}: it is currently in use")

with tritonshm.CudaRegion.create(4 * 16384) as region:
    region.write(np.full(16384, 7, np.float32))
    x = region.view(np.float32, (16384,))
c = tritonshm.Client(url, slot_timeout=0.1, by_reference=False)
c.model_info("slow_fp32")

def run():
    try:
        c.infer("slow_fp32", {"INPUT0": x})
    except Exception:
        pass

threading.Thread(target=run, daemon=True).start()
time.sleep(0.2)  # (on the server now)
triton.unregister = refusing
if mode == "close":
    c.close()  # its CUDA slot is held: the asking thread runs, and is refused for ever
print("exiting", flush=True)  # ("open": the client's finalizer closes it as the process exits)
"""


@pytest.mark.parametrize("mode", ["close", "open"])
def test_a_process_exits_at_once_while_memory_is_held_for_the_server(fake_cuda_server, fake_cuda, mode):
    """Nothing is asked at exit: a process whose client left memory with a server that never lets
    go of it (closed, or closed by its finalizer as the process ends) exits at once -- the thread
    asking about it neither keeps the process alive nor runs on into its end."""
    import subprocess
    import sys

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, client_url(fake_cuda_server, "grpc"), mode],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "exiting"
    assert time.monotonic() - started < 20  # (not the 60 s timeout: nothing waited for the thread)
    time.sleep(SLOW)  # (the server lets go of the dead process's memory: its request ends)
