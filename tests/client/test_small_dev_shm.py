"""A small /dev/shm (issue 39, item 3): Docker gives a container 64 MiB, and a pool of ``slots`` x
(inputs + outputs) did not fit there -- every large request raised ENOSPC, none fell back.

Now a pool starts with the slots /dev/shm has room for (half of what ``statvfs`` says is free: the
server beside us copies requests into /dev/shm too), grows as room allows, and a request with no
room for one slot goes on the wire with one warning per client; the kernel's own ENOSPC (statvfs
is a hint) is read the same way.

Without a server: the sizing rule, the fallback's answer, and a client against the fake Triton
on a simulated /dev/shm (:class:`SmallShm`: ``statvfs`` reports it, making slot memory past it
fails with ENOSPC as tmpfs's ``posix_fallocate`` does).  With one (marked server): a real Triton
and the client sharing a real 64 MiB tmpfs in a private mount namespace.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import tritonshm
from tritonshm import errors
from tritonshm.client import _slots
from tritonshm.client._fallback import Fallback, Next, Step

MiB = 1 << 20
ELEMENTS = 16384          # 64 KiB in, 64 KiB out: one slot of identity_fp32 is 128 KiB
SLOT = 128 << 10


def floats(n: int = ELEMENTS, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


# -- the sizing rule and the fallback's answer --------------------------------------------------


@pytest.mark.parametrize("free, expected", [
    (None, 4),               # nothing known (device memory, no /dev/shm): the slots asked for
    (64 * MiB, 2),           # half of what is free: 32 MiB, two 16 MiB slots
    (63 * MiB, 1),           # Docker's 64 MiB once the server holds one: one slot
    (32 * MiB, 1),
    (32 * MiB - 1, 0),       # not even one: the wire
    (0, 0),
    (1 << 40, 4),            # never more than asked for
])
def test_a_pool_takes_at_most_half_of_what_is_free(free, expected):
    from tritonshm.client._pool import slots_with_room

    assert slots_with_room(16 * MiB, 4, free) == expected


def test_no_room_sends_one_request_on_the_wire_and_warns_once_per_client():
    state = Fallback("auto", "gRPC")
    first = state.no_room("/dev/shm is full")
    assert first.next is Next.WIRE and "/dev/shm is full" in first.warning and "plain gRPC" in first.warning
    assert state.no_room("/dev/shm is full") == Step(Next.WIRE)   # warned already
    assert not state.wire and state.describe() == "auto"          # no step taken: the next request tries slots


@pytest.mark.parametrize("transport, strict", [("shm", False), ("cuda", False), ("auto", True)])
def test_no_room_is_raised_where_shared_memory_is_insisted_on(transport, strict):
    state = Fallback(transport, "gRPC")
    assert state.no_room("full", strict) == Step(Next.RAISE)
    assert not state.wire


# -- a client against the fake Triton, on a simulated /dev/shm -------------------------------


class SmallShm:
    """/dev/shm of *size* bytes as the client sees it: ``os.statvfs`` reports it, and making host
    slot memory past it raises ENOSPC, as tmpfs's ``posix_fallocate`` does.  *others* bytes are
    another process's (the server's segments); *unseen* ones were taken since statvfs was read
    (a race: the kernel refuses them, and statvfs shows them once it has)."""

    def __init__(self, size: int, fake, monkeypatch):
        self.size, self.others, self.unseen = size, 0, 0
        self._live = lambda: fake.memory_bytes  # our own slot memory alive (the fake meters it)
        real_statvfs = os.statvfs

        def statvfs(path):
            if os.fspath(path) != "/dev/shm":
                return real_statvfs(path)
            free = max(self.free, 0) // 4096
            return os.statvfs_result((4096, 4096, self.size // 4096, free, free, 1 << 20, 1 << 20, 1 << 20, 0, 255))

        cls = _slots.SystemSlotMemory
        metered = cls.__init__

        def init(memory, nbytes, *args, **kwargs):
            if nbytes > self.free - self.unseen:
                self.others, self.unseen = self.others + self.unseen, 0  # statvfs sees them from now on
                raise errors.os_error(errno.ENOSPC, f"creating a segment of {nbytes} bytes")
            metered(memory, nbytes, *args, **kwargs)

        monkeypatch.setattr(os, "statvfs", statvfs)
        monkeypatch.setattr(cls, "__init__", init)  # (over the fake's meter, which it calls)

    @property
    def free(self) -> int:
        return self.size - self.others - self._live()


@pytest.fixture
def small_shm(fake_triton, monkeypatch):
    """A simulated /dev/shm of 1 MiB (eight 128 KiB slots) for the fake Triton's clients."""
    return SmallShm(1 * MiB, fake_triton, monkeypatch)


def pool_slots(client) -> list[int]:
    return [pool.slots for pool in client.pools()]


@contextlib.contextmanager
def threads(n: int):
    """``submit`` of a thread pool of *n* workers, shut down on exit."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        yield pool.submit


ROOM_FOR_ONE = 1 * MiB - 5 * SLOT // 2   # others' share that leaves 320 KiB: one slot, and no room to grow


def test_a_pool_starts_with_the_slots_dev_shm_has_room_for(fake_triton, small_shm):
    small_shm.others = 512 << 10   # 512 KiB free: half of it is two slots
    with fake_triton.client() as c, warnings.catch_warnings():
        warnings.simplefilter("error")  # fewer slots is no reason to warn
        x = floats()
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        assert pool_slots(c) == [2], "the pool took more of /dev/shm than half of what was free"


def test_no_room_for_one_slot_goes_on_the_wire_with_one_warning_and_slots_again_later(fake_triton, small_shm):
    small_shm.others = 1 * MiB - 3 * SLOT // 2   # 192 KiB free: half of it holds no slot
    x = floats()
    with fake_triton.client() as c:
        with pytest.warns(RuntimeWarning) as warned:
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + 1})["OUTPUT0"], x + 1)
        (warning,) = [str(w.message) for w in warned]   # one, not one per request
        assert "/dev/shm (1 MiB" in warning and "--shm-size" in warning and "plain gRPC" in warning
        assert c.pools() == [] and fake_triton.registrations == 0  # both went on the wire
        small_shm.others = 0   # room came free: the next request tries the slots again, quietly
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + 2})["OUTPUT0"], x + 2)
        assert pool_slots(c) == [4]


def test_the_kernels_enospc_goes_on_the_wire_too(fake_triton, small_shm):
    small_shm.unseen = 1 * MiB   # statvfs says 1 MiB is free; another process took it meanwhile
    x = floats()
    with fake_triton.client() as c:
        with pytest.warns(RuntimeWarning, match=r"/dev/shm.*ENOSPC.*--shm-size"):
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        assert c.pools() == []
        small_shm.others = 0   # the other process let go
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x + 1})["OUTPUT0"], x + 1)
        assert len(c.pools()) == 1


def test_shm_transport_raises_enospc_naming_the_model_instead(fake_triton, small_shm):
    small_shm.others = 1 * MiB - SLOT
    with fake_triton.client(transport="shm") as c, warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(tritonshm.SharedMemoryOSError, match="'identity_fp32'.*/dev/shm") as raised:
            c.infer("identity_fp32", {"INPUT0": floats()})
        assert raised.value.errno == errno.ENOSPC


def test_a_pool_made_small_grows_as_room_allows_up_to_the_slots_asked_for(fake_triton, small_shm):
    small_shm.others = ROOM_FOR_ONE
    fake = fake_triton
    with fake.client() as c, threads(6) as submit:
        x = floats()
        c.infer("identity_fp32", {"INPUT0": x})
        assert pool_slots(c) == [1]
        small_shm.others = 0                  # 1 MiB less our slot: room for more
        fake.stall()
        try:
            futures = [submit(c.infer, "identity_fp32", {"INPUT0": x + i}) for i in range(6)]
            assert fake.wait_stalled(4), "the pool did not grow while requests in flight filled it"
            time.sleep(0.05)
            assert pool_slots(c) == [4]       # no more than the slots asked for: two requests wait
        finally:
            fake.release()
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result()["OUTPUT0"], x + i)


def test_a_pool_with_no_room_to_grow_makes_its_requests_wait_for_a_slot(fake_triton, small_shm):
    small_shm.others = ROOM_FOR_ONE            # and it stays so
    fake = fake_triton
    with fake.client() as c, threads(3) as submit, warnings.catch_warnings():
        warnings.simplefilter("error")
        x = floats()
        futures = [submit(c.infer, "identity_fp32", {"INPUT0": x + i}) for i in range(3)]
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result()["OUTPUT0"], x + i)
        assert pool_slots(c) == [1]


def test_the_kernels_enospc_while_growing_waits_for_a_slot(fake_triton, small_shm):
    """Growth for a kept result (copy=False) that the kernel refuses: the request waits for the
    kept slot instead of raising."""
    x = floats()
    with fake_triton.client(slots=1) as c, threads(1) as submit:
        kept = c.infer("identity_fp32", {"INPUT0": x}, copy=False)["OUTPUT0"]
        small_shm.unseen = 1 * MiB      # statvfs shows room to grow; the kernel has none
        future = submit(c.infer, "identity_fp32", {"INPUT0": x + 1})
        time.sleep(0.2)
        assert not future.done() or future.exception() is None, future.exception()
        np.testing.assert_array_equal(kept, x)
        del kept                         # the slot comes back: the waiting request takes it
        np.testing.assert_array_equal(future.result(timeout=10)["OUTPUT0"], x + 1)
        assert pool_slots(c) == [1]


def test_several_models_pools_together_take_at_most_half_of_dev_shm(fake_triton, small_shm):
    """Each model's pool takes of what the client's other pools left, and all of them together at
    most half of /dev/shm: the server copies their requests there too.  (Each took half of what
    was free after the others: two models' pools took three quarters, and a real Triton in 64 MiB
    failed their requests -- "Failed to increase the shared memory pool size".)"""
    with fake_triton.client() as c, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a model with no room left goes on the wire)
        x = floats()
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        np.testing.assert_array_equal(c.infer("repeat_fp32", {"INPUT0": x})["OUTPUT0"], np.tile(x, 3))
        pools = [(pool.model, pool.slot_bytes, pool.slots) for pool in c.pools()]
        assert sum(nbytes * slots for _, nbytes, slots in pools) <= small_shm.size // 2, pools


def test_an_output_that_outgrows_a_slot_with_no_room_to_grow_runs_once_a_request(fake_triton, small_shm):
    """A variable output larger than its slot, where /dev/shm has no room for a larger one: the
    request goes on the wire -- and so do the later requests of those shapes, once each, not run
    first on the slot they outgrow (the model ran twice a request, for good)."""
    small_shm.others = small_shm.size - (300 << 10)   # room for a 128 KiB slot, not for a 256 KiB one
    x = floats()
    with fake_triton.client() as c, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (no room: the wire, with the one warning)
        for _ in range(2):  # (the first learns how large the output is; the second, its quick plan)
            np.testing.assert_array_equal(c.infer("repeat_fp32", {"INPUT0": x})["OUTPUT0"], np.tile(x, 3))
        before = fake_triton.calls["send"]
        for _ in range(3):
            np.testing.assert_array_equal(c.infer("repeat_fp32", {"INPUT0": x})["OUTPUT0"], np.tile(x, 3))
        assert fake_triton.calls["send"] - before == 3


def test_a_pool_replaced_by_a_larger_one_gives_its_room_first(fake_triton, small_shm):
    small_shm.size = 3 * MiB // 2
    x = floats()
    with fake_triton.client() as c, warnings.catch_warnings():
        warnings.simplefilter("error")
        c.infer("identity_fp32", {"INPUT0": x})
        assert pool_slots(c) == [4]        # 512 KiB: 1 MiB free beside it
        big = floats(5 * ELEMENTS)         # a slot of 640 KiB needs 1.25 MiB free: only without the old pool
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": big})["OUTPUT0"], big)
        (pool,) = c.pools()
        assert (pool.slot_bytes, pool.slots) == (5 * SLOT, 1)


# -- a real Triton sharing a 64 MiB /dev/shm with the client ---------------------------------

#: A private mount namespace whose /dev/shm is a 64 MiB tmpfs (Docker's default), as LocalServer's
#: private_shm makes one; the scenario starts its server inside, so both see the same /dev/shm.
_IN_64_MIB_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh"]

#: Run in that namespace with the protocol as argv[1]: one client through the sizes, then one whose
#: statvfs says there is plenty (the kernel's ENOSPC then); prints each step as JSON.  Only
#: identity_fp32 is loaded: each model's Python backend keeps a segment of its own in /dev/shm.
_SCENARIO = textwrap.dedent("""
    import json, os, shutil, sys, tempfile, warnings
    import numpy as np
    import tritonshm
    from tritonshm import _segments
    from tritonshm.server import LocalServer, ServerInstallError, bundled_model_repository

    root, bundled = tempfile.mkdtemp(), bundled_model_repository()
    shutil.copy(bundled.parent / "_bundled_model.py", root)  # where the models' model.py finds it
    shutil.copytree(bundled / "identity_fp32", os.path.join(root, "models", "identity_fp32"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    steps = []

    def run(c, step, mib):
        x = np.arange(mib << 18, dtype=np.float32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                error = None if np.array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x) else "wrong"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        steps.append({"step": step, "error": error, "pools": [[p.slot_bytes >> 20, p.slots] for p in c.pools()],
                      "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning]})

    try:
        server = LocalServer(os.path.join(root, "models"), quiet=True).start()
    except ServerInstallError as exc:
        print(json.dumps({"skip": str(exc).splitlines()[0]}))
        sys.exit()
    with server:
        url = server.grpc_url if sys.argv[1] == "grpc" else "http://" + server.http_url
        filler = os.open("/dev/shm/filler", os.O_CREAT | os.O_RDWR, 0o600)
        os.posix_fallocate(filler, 0, 48 << 20)  # another process's 48 MiB
        with tritonshm.Client(url) as c:
            run(c, "4 MiB, 15 MiB free", 4)
            os.close(filler)
            os.unlink("/dev/shm/filler")
            run(c, "4 MiB", 4)
            run(c, "8 MiB", 8)
            run(c, "16 MiB", 16)
            run(c, "8 MiB again", 8)
        _segments.space = lambda *args: _segments.Space(1 << 40, 1 << 40)  # statvfs, a hint, is wrong
        with tritonshm.Client(url) as c:
            run(c, "8 MiB, the kernel's ENOSPC", 8)
    print(json.dumps({"steps": steps}))
""")


def _in_64_mib_shm_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*_IN_64_MIB_SHM, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.server
@pytest.mark.skipif(not _in_64_mib_shm_works(), reason="cannot mount a tmpfs on /dev/shm in a private mount "
                                                         "namespace here (unshare --mount needs root)")
def test_a_64_mib_dev_shm_shared_with_a_real_triton(protocol):
    """Triton's Python backend copies each request's inputs and outputs into a segment of its
    own in the same /dev/shm, and keeps that room (about 2x the largest request and 4 MiB): after
    a 16 MiB request it holds 36 MiB.  So in 64 MiB a 16 MiB slot (32 MiB) cannot fit beside it,
    and 40 MiB cannot be served even on the wire -- the server itself runs out.  What must hold:
    4 and 8 MiB requests through fewer slots than asked for, the rest on the wire, nothing raised,
    one warning per client; a full /dev/shm's request on the wire, then slots once room came free."""
    done = subprocess.run([*_IN_64_MIB_SHM, sys.executable, "-c", _SCENARIO, protocol],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    if "skip" in result:
        if os.environ.get("TRITONSHM_REQUIRE_SERVER") == "1":
            pytest.fail(f"no local Triton server: {result['skip']}")
        pytest.skip(f"no local Triton server ({result['skip']})")
    steps = {step.pop("step"): step for step in result["steps"]}
    assert {name: step["error"] for name, step in steps.items() if step["error"]} == {}, "raised"
    full, room, eight, sixteen, again, kernel = steps.values()
    (warning,) = full["warnings"]
    assert "/dev/shm (64 MiB" in warning and "--shm-size" in warning
    assert full["pools"] == []                              # on the wire
    ((slot, slots),) = room["pools"]
    assert slot == 8 and 0 < slots < 4                      # room came free: fewer slots than asked for
    ((slot, slots),) = eight["pools"]
    assert slot == 16 and 0 < slots < 4                     # a larger pool, the old one's room given back
    assert sixteen["pools"] == eight["pools"] == again["pools"]   # 16 MiB on the wire; 8 MiB through the slots
    assert room["warnings"] == eight["warnings"] == sixteen["warnings"] == again["warnings"] == []
    assert kernel["pools"] == [] and len(kernel["warnings"]) == 1 and "ENOSPC" in kernel["warnings"][0]


def test_a_zero_copy_request_with_no_room_says_so(fake_triton, small_shm):
    """request() hands out views of a slot: it cannot go on the wire, and with no room for one slot
    it says that /dev/shm is full (it said the server cannot open our shared memory)."""
    small_shm.others = 1 * MiB - 3 * SLOT // 2   # 192 KiB free: half of it holds no slot
    with fake_triton.client() as c:
        with pytest.raises(tritonshm.SharedMemoryOSError, match="identity_fp32") as raised:
            c.request("identity_fp32", shapes={"INPUT0": [ELEMENTS]})
        assert raised.value.errno == errno.ENOSPC
