"""Threads mixing every way of sending a GPU tensor, on the FAKE runtime against a real Triton.

Each thread runs a seeded random mix of requests on two shared clients: a lent
input with results written in place (or copied where no slot is spare),
``copy=False`` views, a lent ``out=``, a fresh tensor each time (copied: used
once), host arrays, copies (``by_reference=False``), a batch in chunks, an
``infer_async``, a zero-copy ``request()``, ``forget()`` -- and, over gRPC,
requests given up on (``client_timeout``) that the server still runs, writing
their ``out=`` and reading their input later.  Every value is its request's
own, checked when it arrives and again while it is kept (a slot or block
handed to another request while a result or the server still has it shows
up as another request's value); nothing is freed under the server.  Once
with the server answering unregisters as Triton 2.53 does (deferred, not
refused: :mod:`support.deferring_triton`).  Then ``close()`` from another
thread in the middle of it all.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np
import pytest

import tritonshm
from tritonshm.errors import ClientClosed, ServerTimeout, TensorInUse

from support.deferring_triton import DeferringUnregisters
from triton_fixtures import client_url

pytestmark = pytest.mark.server

N = 2048
THREADS = 4
OPS = 30
SLOW = 0.5  # slow_fp32's delay


def _values_of(result: Any) -> np.ndarray:
    return result.get() if hasattr(result, "get") else np.asarray(result)


class Mix:
    """One thread's requests (*ops*: a letter each, see :meth:`run`), every answer checked."""

    def __init__(self, thread: int, clients: tuple[Any, Any], torch_like: Any, failures: list[str],
                 closing: threading.Event):
        self.thread, self.failures, self.closing = thread, failures, closing
        self.c, self.copier = clients
        self.torch_like = torch_like
        self.x, self.y = torch_like.zeros(N), torch_like.zeros(N)
        self.y_holds: float | None = 0.0  # what y holds once the last request writing it is done
        self.kept: list[tuple[Any, float]] = []
        self.done = 0  # requests made
        self.refused_closed = 0  # ... of which ClientClosed refused

    def fail(self, what: str) -> None:
        self.failures.append(f"thread {self.thread}: {what}")

    def run(self, ops: str, rng: random.Random) -> None:
        for i, op in enumerate(ops):
            value = float(self.thread * 10000 + i + 1)
            try:
                self.one(op, value)
            except ClientClosed:
                self.refused_closed += 1
                if not self.closing.is_set():
                    self.fail(f"op {i} {op!r}: ClientClosed before close()")
            except Exception as exc:  # noqa: BLE001 (every failure is reported, by op)
                self.fail(f"op {i} {op!r}: {type(exc).__name__}: {exc}")
            self.done += 1
            self.check_kept(f"after op {i} {op!r}")
            rng.shuffle(self.kept)
            del self.kept[rng.randint(3, 6):]  # (some results dropped, their slots back)

    def one(self, op: str, value: float) -> None:
        c, x, y, data = self.c, self.x, self.y, np.full(N, value, np.float32)
        if op == "a":  # lent input; CudaArray results, in place where a slot is spare
            x.copy_(data)
            self.kept.append((c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], value))
        elif op == "b":  # views of the slot
            x.copy_(data)
            self.kept.append((c.infer("identity_fp32", {"INPUT0": x}, copy=False)["OUTPUT0"], value))
        elif op == "c":  # lent out= (it waits for a request given up on that still writes y)
            x.copy_(data)
            try:
                c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, slot_timeout=2)
            except TensorInUse:
                return
            self.y_holds = value
            if not (y.numpy() == value).all():
                self.fail(f"out= holds {y.numpy()[:2]}, not {value}")
        elif op == "d":  # a fresh tensor each time: copied (used once)
            self.kept.append((c.infer("identity_fp32", {"INPUT0": self.torch_like.from_numpy(data)})["OUTPUT0"],
                              value))
        elif op == "e":  # given up on: the server writes y later
            x.copy_(data)
            self.y_holds = None
            try:
                c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.05, slot_timeout=2)
            except (ServerTimeout, TensorInUse):
                return
        elif op == "f":  # host arrays
            self.kept.append((c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], value))
        elif op == "g":  # copies through a CUDA slot
            x.copy_(data)
            self.kept.append((self.copier.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], value))
        elif op == "h":  # zero-copy
            with c.request("identity_fp32", shapes={"INPUT0": [N]}, device="cuda") as request:
                self.torch_like.from_dlpack(request.inputs["INPUT0"]).copy_(data)
                got = _values_of(request.run()["OUTPUT0"])
            if not (got == value).all():
                self.fail(f"zero-copy answered {got[:2]}, not {value}")
        elif op == "i":  # given up on, results in a slot: the slot stays the server's
            x.copy_(data)
            try:
                c.infer("slow_fp32", {"INPUT0": x}, client_timeout=0.05, slot_timeout=2)
            except (ServerTimeout, TensorInUse):
                return
        elif op == "j":
            c.forget()
        elif op == "k":  # a batch in chunks (batched_fp32 doubles)
            rows = np.full((20, 4), value, np.float32)
            result = c.infer("batched_fp32", {"INPUT0": self.torch_like.from_numpy(rows)})["OUTPUT0"]
            self.kept.append((result, 2 * value))
        elif op == "l":
            x.copy_(data)
            self.kept.append((c.infer_async("identity_fp32", {"INPUT0": x}).result()["OUTPUT0"], value))
        else:
            raise AssertionError(op)

    def check_kept(self, when: str) -> None:
        for result, value in self.kept:
            got = _values_of(result)
            if not (got == value).all():
                self.fail(f"{when}: a result kept holds {got.flat[:2]}, not {value}")

    def check_y(self, when: str) -> None:
        if self.y_holds is not None and not (self.y.numpy() == self.y_holds).all():
            self.fail(f"{when}: out= holds {self.y.numpy()[:2]}, not {self.y_holds}")


def _mixes(url: str, torch_like: Any, ops: str, seed: int, close: bool = False) -> list[Mix]:
    """Run THREADS mixes of OPS requests drawn from *ops* (with *close*, the first client closed
    from the main thread once a third of them are made); the mixes, done."""
    failures: list[str] = []
    closing = threading.Event()
    c = tritonshm.Client(url, slots=3)
    copier = tritonshm.Client(url, by_reference=False, slots=2)
    try:
        mixes = [Mix(t, (c, copier), torch_like, failures, closing) for t in range(THREADS)]
        threads = [threading.Thread(target=mix.run, args=("".join(random.Random(seed + t).choice(ops)
                                                                  for _ in range(OPS)), random.Random(t)))
                   for t, mix in enumerate(mixes)]
        for thread in threads:
            thread.start()
        if close:
            while sum(mix.done for mix in mixes) < THREADS * OPS // 3:
                time.sleep(0.005)
            closing.set()
            c.close()
        for thread in threads:
            thread.join()
        time.sleep(SLOW + 0.3)  # (requests given up on have written what they write)
        for mix in mixes:
            mix.check_kept("at the end")
            mix.check_y("at the end")
            mix.kept.clear()
        return mixes
    finally:
        c.close()
        copier.close()


@pytest.mark.parametrize("protocol, server_release", [("grpc", "2.51"), ("http", "2.51"), ("grpc", "2.53")])
def test_threads_mixing_every_way_of_sending_gpu_tensors_each_get_their_own_answers(
        fake_cuda_server, torch_like, monkeypatch, protocol, server_release):
    deferring = DeferringUnregisters(fake_cuda_server).install(monkeypatch) if server_release == "2.53" else None
    ops = "aabbccddfghjkl" + ("eeii" if protocol == "grpc" else "")  # (client_timeout is gRPC's)
    failures: list[str] = []
    try:
        failures = _mixes(client_url(fake_cuda_server, protocol), torch_like, ops, seed=7)[0].failures
    finally:
        if deferring is not None:
            deferring.stop()
    assert not failures, "\n".join(failures[:20])
    if deferring is not None:
        assert deferring.deferred  # (the server did defer unregisters)


def test_close_in_the_middle_of_it_all_leaves_every_answer_and_result_intact(fake_cuda_server, torch_like):
    """close() from another thread while the mixes run (no request given up on: what close()
    leaves is then all let go of before the test ends): every call either answers its own value
    or raises ClientClosed, and results kept from before the close stay intact."""
    mixes = _mixes(client_url(fake_cuda_server, "grpc"), torch_like, "aabbccddfghkl", seed=11, close=True)
    failures = mixes[0].failures
    assert not failures, "\n".join(failures[:20])
    assert sum(mix.refused_closed for mix in mixes) > 0  # (closed while they ran)
