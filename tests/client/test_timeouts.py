"""``timeout=`` means what it means in tritonclient -- the server's timeout, in microseconds -- on
every call of both clients; the wait for a slot is ``slot_timeout=`` (seconds), on the calls and on
the client.  A value that can only be the other one is refused, naming both, before anything is
registered or sent (against the fake Triton: no server, milliseconds)."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

import tritonshm
from tritonshm.errors import InvalidOption, InvalidOptionType

X = {"INPUT0": np.ones(1024, np.float32)}


def test_both_clients_name_the_slot_wait_slot_timeout_and_take_no_timeout_of_their_own():
    for cls in (tritonshm.Client, tritonshm.aio.Client):
        for name in ("infer", "stream", "request"):
            parameters = inspect.signature(getattr(cls, name)).parameters
            assert "slot_timeout" in parameters and "timeout" not in parameters, (cls, name)
    assert "slot_timeout" in inspect.signature(tritonshm.Client).parameters
    assert "timeout" not in inspect.signature(tritonshm.Client).parameters


@pytest.mark.parametrize("seconds", [0.5, 2.5, 1e-3, 30.0])
def test_a_timeout_in_seconds_is_refused_naming_both_before_anything_is_registered(fake_triton, seconds):
    with fake_triton.client() as c:
        for call in (lambda: c.infer("identity_fp32", X, timeout=seconds),
                     lambda: c.infer_async("identity_fp32", X, timeout=seconds).result()):
            with pytest.raises(InvalidOptionType, match=r"server's timeout in microseconds.*slot_timeout=") as caught:
                call()
            assert isinstance(caught.value, TypeError)
        assert fake_triton.registrations == 0


def test_server_timeout_is_gone_and_request_takes_no_request_options(fake_triton):
    with fake_triton.client() as c:
        with pytest.raises(InvalidOptionType, match=r"server_timeout is now timeout=1000 .*slot_timeout"):
            c.infer("identity_fp32", X, server_timeout=1000)
        with pytest.raises(InvalidOptionType, match=r"request\(\) takes no request options \(priority, timeout\)"):
            c.request("identity_fp32", timeout=1000, priority=1)
        assert fake_triton.registrations == 0


def test_slot_timeout_is_checked_on_the_client_and_on_each_call(fake_triton):
    for bad, error in ((-1, InvalidOption), (float("inf"), InvalidOption), (1e10, InvalidOption),
                       ("5", InvalidOptionType)):
        with pytest.raises(error, match="slot_timeout"):
            tritonshm.Client("localhost:8001", slot_timeout=bad)
    with fake_triton.client(slot_timeout=2) as c:
        assert c.slot_timeout == 2.0
        with pytest.raises(InvalidOption, match=r"slot_timeout must be None \(for ever\) or a number of seconds"):
            c.infer("identity_fp32", X, slot_timeout=-0.5)
        out = c.infer("identity_fp32", X, slot_timeout=0.5, timeout=1_000_000)  # both meanings, each its own name
        np.testing.assert_array_equal(out["OUTPUT0"], X["INPUT0"])
        for bad, error in ((-1, InvalidOption), (float("nan"), InvalidOption), ("1", InvalidOptionType)):
            with pytest.raises(error, match="slot_timeout"):  # (a slot free: refused all the same, not only
                c.request("identity_fp32", shapes={"INPUT0": [4]}, slot_timeout=bad)  # once it must wait)
        with c.request("identity_fp32", shapes={"INPUT0": [4]}, slot_timeout=0.5) as req:
            req.inputs["INPUT0"][:] = 2
            np.testing.assert_array_equal(req.run(timeout=1_000_000)["OUTPUT0"], 2)


def test_aio_the_same(fake_triton):
    async def main():
        async with await fake_triton.aio_client(slot_timeout=3) as c:
            assert c.slot_timeout == 3.0
            with pytest.raises(InvalidOptionType, match="slot_timeout="):
                c.infer("identity_fp32", X, timeout=0.25)  # refused when called, not when awaited
            with pytest.raises(InvalidOptionType, match="request options"):
                await c.request("identity_fp32", timeout=10)
            out = await c.infer("identity_fp32", X, slot_timeout=1, timeout=1_000_000)
            np.testing.assert_array_equal(out["OUTPUT0"], X["INPUT0"])

    asyncio.run(main())
    assert fake_triton.registrations >= 1
