"""The count of requests in flight, and a closing client's wait for the last one, without a
server: :class:`tritonshm.client._engine.InFlight` (the clients' close() with requests stalled
in a server: tests/client/test_engine_fake_triton.py)."""

from __future__ import annotations

import threading
import time

from tritonshm.client._engine import InFlight


def test_counts_nested_entries_and_wakes_nobody_until_someone_waits():
    flight, woken = InFlight(), []
    with flight:
        with flight:  # a request enters more than once (its chunk, then its run)
            assert flight.count == 2
        assert flight.count == 1
    assert flight.count == 0
    assert flight.on_idle(lambda: woken.append(1)) is True  # none in flight: no call
    assert woken == []


def test_a_blocking_wait_ends_with_the_last_request_or_at_its_timeout():
    flight = InFlight()
    flight.__enter__()
    started = time.monotonic()
    assert flight.wait_idle(0.05) is False
    assert time.monotonic() - started >= 0.05
    threading.Timer(0.05, flight.__exit__, (None, None, None)).start()
    assert flight.wait_idle(5.0) is True
    assert flight.count == 0


def test_the_last_request_wakes_each_waiter_once_from_its_own_thread():
    flight, woken = InFlight(), []
    flight.__enter__()
    flight.__enter__()
    assert flight.on_idle(lambda: woken.append(threading.current_thread().name)) is False
    flight.__exit__(None, None, None)
    assert woken == []  # one still in flight
    ender = threading.Thread(target=flight.__exit__, args=(None, None, None), name="ender")
    ender.start()
    ender.join()
    assert woken == ["ender"]
    with flight:
        pass
    assert woken == ["ender"]  # woken once
