"""The marks that prove copies complete without a query (``_devices.stream_waited`` /
``waited``, issue 40) stay bounded: a caller making a stream per call, or requests that fail
between recording an event and waiting for it, grow nothing without end; what is forgotten is
only queried instead."""

from __future__ import annotations

import pytest

from tritonshm.client import _devices


class FakePending:
    def __init__(self):
        self.done = False

    def completed(self):
        self.done = True


@pytest.fixture(autouse=True)
def clean_marks(fake_cuda):  # (the marks are kept per runtime: the FAKE one here)
    saved = dict(_devices._stream_waits), dict(_devices._covers)
    _devices._stream_waits.clear()
    _devices._covers.clear()
    yield
    _devices._stream_waits.clear()
    _devices._covers.clear()
    _devices._stream_waits.update(saved[0])
    _devices._covers.update(saved[1])


def test_a_stream_per_call_is_remembered_a_bounded_number_of_times():
    for handle in range(1000, 1000 + 10 * _devices._MARKS):
        _devices.stream_waited(0, handle, FakePending())
    assert len(_devices._stream_waits) <= _devices._MARKS


def test_events_never_waited_for_are_remembered_a_bounded_number_of_times():
    for n in range(10 * _devices._MARKS):
        _devices._recorded(object(), [FakePending()])
    assert len(_devices._covers) <= _devices._MARKS


def test_a_wait_on_a_later_event_proves_what_its_stream_waited_for_and_nothing_else():
    mine, other = FakePending(), FakePending()
    _devices.stream_waited(0, 5000, mine)
    _devices.stream_waited(0, 6000, other)
    event = object()
    _devices._recorded(event, _devices._recording(0, 5000))
    _devices.waited(event)
    assert mine.done and not other.done
    _devices.waited(event)  # (once only: a second wait proves nothing more)
    assert not other.done
