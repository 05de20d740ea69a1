"""The warm all-lent request: every tensor the caller's GPU memory, registered before (FAKE runtime).

A call seen before whose every input is a GPU tensor and whose every output has
an ``out=`` tensor, each in an allocation the lent table registered already,
takes a straight-line path (``Runner.lent_quick_steps``): no slot, no copy, no
registration.  These tests call each request once first, so that the call
under test is the warm one, and check that the short path keeps what the full
way guarantees: it reads what the caller queued last, registers again what a
restarted server forgot, and goes the full way for an allocation it does not
know.  A warm call timed out, and one into an out= another call writes, are
the ``warm`` cases of test_client_lent_hazards.py's tests of those.

The server is a real Triton with the fake CUDA runtime LD_PRELOADed (see
test_client_lent.py).
"""

from __future__ import annotations


import numpy as np
import pytest

import tritonshm

from triton_fixtures import client_url

N = 16384  # floats: 64 KiB, a block of a 2 MiB segment of the caching double


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    return client_url(fake_cuda_server, protocol)


def test_a_warm_all_lent_request_reads_what_the_caller_queued_last(url, fake_cuda, torch_caching):
    """The fake lands queued work only when its stream is synchronized: a warm request sent
    without waiting for the call's ordering point reads the input as it was before the copy."""
    x = torch_caching.zeros(N)
    y = torch_caching.zeros(N)
    with tritonshm.Client(url) as c:
        for value in range(1, 5):
            x.fill_(value)  # queued on the caller's stream, not landed
            assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"] is y
            assert (y.numpy() == value).all()
        stats = c.stats()
        assert (stats.inputs_lent, stats.outputs_lent, stats.registrations, stats.copied) == (4, 4, 1, {})
    del x, y


def test_a_warm_all_lent_request_the_server_forgot_is_registered_again(url, fake_cuda, torch_caching):
    x = torch_caching.from_numpy(np.full(N, 3, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(url) as c:
        for _ in range(2):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        names = sorted(entry.name for entry in c.lent())
        for name in names:  # as a restarted server would have
            c.tritonclient.unregister_cuda_shared_memory(name)
        x.fill_(5)
        assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"] is y
        assert (y.numpy() == 5).all()
        assert sorted(entry.name for entry in c.lent()) == names  # the same names again, registered again
        assert c.stats().registrations == len(names)
    del x, y


def test_a_warm_request_of_an_allocation_not_lent_before_goes_the_full_way(url, fake_cuda, torch_caching):
    """The same shapes (the same plan), but the out= tensor in an allocation the client has not
    lent yet: it is registered, and the answer lands there."""
    x = torch_caching.from_numpy(np.full(N, 4, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(url) as c:
        for _ in range(2):
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        registered = c.stats().registrations
        (entry,) = c.lent()
        fillers = []  # blocks of the lent segment, taken until the double carves a new one
        y2 = torch_caching.zeros(N)
        while entry.base <= y2.ptr < entry.base + entry.nbytes:
            fillers.append(y2)
            y2 = torch_caching.zeros(N)
        assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y2})["OUTPUT0"] is y2
        assert (y2.numpy() == 4).all()
        assert c.stats().registrations == registered + 1
        del fillers
    del x, y, y2
