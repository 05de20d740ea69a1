"""Lending, issue 38: "used once" read from the allocation pattern, and a registration whose
reply comes after close() (FAKE runtime).

The server is a real Triton with the fake CUDA runtime LD_PRELOADed (see test_client_lent.py):
it opens the fake IPC handles of the caller's allocations, and the fake counts memory freed
while the server still had it open (``freed_while_open``: never allowed here).  Tensors come
from the torch-like double with a caching allocator: allocations of 1 MiB or more get segments
of their own, reused for any later tensor that fits once free, as torch's large pool does.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

import tritonshm
from tritonshm.client._disposal import held_for_the_server
from tritonshm.client._steps import Register
from tritonshm.errors import translate_error

from support.insides import wrap_step
from triton_fixtures import client_url

N = 16384  # floats: 64 KiB, a block of a 2 MiB segment of the caching double
MiB = 1 << 20


def lent_names(probe):
    """The server's CUDA regions that clients' lending registered."""
    return {n for n in tritonshm.status(probe.tritonclient, kind="cuda") if n.startswith("tritonshm-lent-")}


# -- case 7: "used once", whatever the sizes -----------------------------------------------------------

# x = batch.cuda() with variable batch or sequence lengths: 64-86 MiB, each size once, in no order
VARYING = [(64 + 2 * k) * MiB for k in (5, 0, 9, 3, 11, 1, 7, 4, 10, 2, 8, 6)]


def test_fresh_allocations_of_varying_sizes_are_copied_not_held(fake_cuda_server, fake_cuda, torch_caching):
    """The everyday loop ``x = batch.cuda(); c.infer(m, {"x": x}); del x`` with a batch of another
    size each time.  Before: only an idle allocation of the *same* size, lent once, was taken for
    "used once", so each of the 12 requests left its allocation registered -- 12 registrations,
    900 MiB held on the way to max_lent_bytes, and torch made a new segment for every batch.
    Now the pattern (allocations that keep being new, one per request) is read whatever the
    sizes: a couple registered at most, and torch reuses its segments."""
    with tritonshm.Client(client_url(fake_cuda_server, "grpc"), slots=2) as c:  # (copies: slots that fit)
        most = 0
        for i, nbytes in enumerate(VARYING):
            x = torch_caching.empty(nbytes, np.uint8)
            x.fill_(i)
            out = c.infer("identity_uint8", {"INPUT0": x})["OUTPUT0"]
            assert int(out.get()[-1]) == i
            most = max(most, len(c.lent()))
            del x, out
            gc.collect()
        stats = c.stats()
        assert most <= 2, f"{most} fresh allocations held at once"
        assert stats.registrations <= 2 and stats.copied.get("used once", 0) >= len(VARYING) - 2, stats
        reserved = sum(size for _, size in torch_caching.allocator.segments())
        assert reserved <= 4 * max(VARYING), f"{reserved >> 20} MiB reserved by the caller's allocator"


def test_buffers_given_again_stay_registered_whatever_their_sizes(fake_cuda_server, fake_cuda, torch_caching):
    """Three static buffers of different sizes, sent in turn again and again: allocations that
    really are reused stay registered (at most the first round is copied while the pattern is
    read), however different their sizes are."""
    buffers = [torch_caching.empty(n * MiB, np.uint8) for n in (64, 70, 76)]
    with tritonshm.Client(client_url(fake_cuda_server, "grpc"), slots=2) as c:
        for turn in range(6):
            for i, buffer in enumerate(buffers):
                buffer.fill_(3 * turn + i)
                out = c.infer("identity_uint8", {"INPUT0": buffer})["OUTPUT0"]
                assert int(out.get()[-1]) == 3 * turn + i
                del out
        stats = c.stats()
        assert sorted(e.base for e in c.lent()) == sorted(b.ptr for b in buffers)
        assert stats.inputs_lent >= 18 - 2 and stats.registrations <= 4, stats
    del buffers


# -- case 9: a registration whose reply comes after close() -------------------------------------------

def _close_while_registering(url, given, reply):
    """A client (slot_timeout 0.05 s) whose first registration -- the allocation of the tensor
    in the list *given*, lent (taken from the list: the caller holds it alone) -- is on its
    way when close() stops waiting for the request: ``reply(register, step, closed)`` is the
    Register step's handler, called once close() returned.  Returns the request's failures."""
    c = tritonshm.Client(url, slot_timeout=0.05)
    c.model_info("identity_fp32")
    on_its_way, closed = threading.Event(), threading.Event()

    def slow(register):
        def handler(step):
            if on_its_way.is_set():  # (only the first)
                return register(step)
            on_its_way.set()
            return reply(register, step, closed)
        return handler

    wrap_step(c, Register, slow)
    failures = []

    def call():
        try:
            c.infer("identity_fp32", {"INPUT0": given.pop()})
        except tritonshm.Error as exc:
            failures.append(type(exc))  # (not the exception: its traceback would hold the tensor)
        finally:
            # HTTP: a closed client's connector unregisters on a short-lived tritonclient client
            # of the calling thread, and leaves that thread's gevent hub (two descriptors) behind
            # (its own I/O threads destroy theirs): not this test's concern.
            from gevent._hub_local import get_hub_if_exists

            hub = get_hub_if_exists()
            if hub is not None:
                hub.destroy(destroy_loop=True)

    running = threading.Thread(target=call)
    running.start()
    assert on_its_way.wait(5)
    c.close()
    closed.set()
    running.join()
    return failures


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_registration_whose_reply_comes_after_close_is_unregistered_then(fake_cuda_server, fake_cuda,
                                                                         torch_caching, protocol):
    """The server registered the allocation, and its reply comes after close() returned.
    Before: close() let go of the allocation unnamed -- no unregister (``drop_steps`` skips an
    extent without a name) -- so the name stayed registered on the server and the caller's
    ``empty_cache()`` freed memory the server maps.  Now the lend steps unregister it when the
    reply comes, on a connection of their own (the client's are closed), and let go of it then.
    (gRPC held it for the life of the process: its unregister went to the closed channel.)"""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    torch_caching.synchronize()  # (the request may never wait for it)
    probe = tritonshm.Client(client_url(fake_cuda_server, "grpc"))
    before = lent_names(probe)

    def late(register, step, closed):
        name = register(step)  # registered on the server ...
        closed.wait(5)         # ... the reply arrives after close()
        return name

    failures = _close_while_registering(client_url(fake_cuda_server, protocol), [x], late)
    try:
        assert failures == [tritonshm.ClientClosed]
        left = lent_names(probe) - before
        assert not left, f"{left} still registered on the server"
        del x
        gc.collect()
        assert torch_caching.empty_cache() == 1  # the server let go of it: freed
    finally:
        _unregister_what_is_left(probe, before)
        probe.close()


def test_a_registration_cut_by_close_holds_its_memory(fake_cuda_server, fake_cuda, torch_caching):
    """gRPC: close() closes the channel under a registration on its way, which ends CANCELLED --
    after the server may have registered it.  Before: its memory was let go of (a failed
    registration), and ``empty_cache()`` freed memory the server maps.  Now it is held for the
    life of the process (whether the server has it cannot be known)."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    torch_caching.synchronize()  # (the request may never wait for it)
    probe = tritonshm.Client(client_url(fake_cuda_server, "grpc"))
    before = lent_names(probe)
    registered = []

    def cut(register, step, closed):
        registered.append(register(step))  # the server registered it ...
        closed.wait(5)                     # ... and the channel closed before its reply came
        raise translate_error(InferenceServerException("Channel closed!", status="StatusCode.CANCELLED"),
                              "registering", cuda=True)

    failures = _close_while_registering(client_url(fake_cuda_server, "grpc"), [x], cut)
    try:
        assert failures == [tritonshm.ClientClosed]
        assert lent_names(probe) - before == set(registered)  # (nobody could unregister it)
        del x
        gc.collect()
        assert torch_caching.empty_cache() == 0  # held: the server may have it open
    finally:
        _unregister_what_is_left(probe, before)
        probe.close()


def _unregister_what_is_left(probe, before):
    """A test's clean-up: unregister what the test left registered (tritonclient's own call:
    a name whose registration the client never learnt of is not its own to tritonshm), then
    let go of the memory held for the server."""
    for name in lent_names(probe) - before:
        probe.tritonclient.unregister_cuda_shared_memory(name)
    held, held_for_the_server[:] = list(held_for_the_server), []
    for extent in held:
        extent.release_memory()


# -- healing after a restart, while another call lets go of a lent allocation --------------------------

def test_healing_after_a_restart_holds_the_lent_allocations_it_registers_again(fake_cuda_server, fake_cuda,
                                                                               torch_caching):
    """A request finds the server restarted (every region forgotten) and registers the pools and
    the lent allocations again; ``forget()`` lets go of a lent allocation meanwhile.  Before: the
    allocation, named by no request, was unregistered and closed under its registration on its
    way -- the healing request failed, or the server kept a name nobody unregisters.  Now healing
    holds what it registers again (as a request that names it): forget() leaves it doomed, and it
    is unregistered once the registration is over."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    torch_caching.synchronize()
    probe = tritonshm.Client(client_url(fake_cuda_server, "grpc"))
    before = lent_names(probe)
    with tritonshm.Client(client_url(fake_cuda_server, "grpc")) as c:
        c.infer("identity_fp32", {"INPUT0": x})  # x's allocation stays registered
        c.infer("identity_fp32", {"INPUT0": np.ones(N, np.float32)})  # (and a host pool)
        assert len(c.lent()) == 1
        forgot = []

        def racing(register):
            def handler(step):
                if step.name is not None and step.name.startswith("tritonshm-lent-") and not forgot:
                    forgot.append(True)
                    c.forget()  # another call lets go of it, while its registration is on its way
                return register(step)
            return handler

        probe.tritonclient.unregister_cuda_shared_memory()  # as a restarted server: nothing registered
        probe.tritonclient.unregister_system_shared_memory()
        wrap_step(c, Register, racing)
        out = c.infer("identity_fp32", {"INPUT0": np.ones(N, np.float32)})  # heals, then runs
        np.testing.assert_array_equal(out["OUTPUT0"], np.ones(N, np.float32))
        assert forgot and not c.lent()
        c.infer("identity_fp32", {"INPUT0": np.ones(N, np.float32)})  # (its end lets go of what is due)
        assert lent_names(probe) - before == set(), "a lent allocation left registered on the server"
    del x
    gc.collect()
    assert torch_caching.empty_cache() == 1
    probe.close()
