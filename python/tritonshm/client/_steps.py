"""The vocabulary of sans-I/O request steps.

A request is written once, as a generator with no I/O in it: it *yields*
one of the steps below when it needs the outside world, and gets the
outcome sent back (or the failure thrown in).  The blocking
:class:`~tritonshm.Client` and the asyncio one are two *drivers* that carry
the same steps out in their own way -- the design of pyzmq's
``_future.py``, where one socket class serves both worlds.

Steps are named tuples: a request makes several, and a tuple is the
cheapest immutable record Python has.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generator, NamedTuple

__all__ = ["FetchModel", "FetchModelNames", "FetchServerVersion", "Register", "Unregister", "WaitForSlot", "WaitForDevice", "Pause", "Send", "StreamSend",
           "NextResponse", "Emit", "Done", "advance", "Steps"]


class FetchModel(NamedTuple):
    """Read a model's metadata and config: outcome ``(metadata, config)`` as dicts."""

    model: str
    version: str


class FetchServerVersion(NamedTuple):
    """Read the server's metadata: outcome its version, a str ('' where it gives none)."""


class FetchModelNames(NamedTuple):
    """Read the names of the models in the server's repository: outcome a sorted list of str
    (to say which it has when a model is not among them)."""


class Register(NamedTuple):
    """Register slot memory with the server (under *name* again, if given): outcome the name."""

    memory: Any
    name: str | None = None


class Unregister(NamedTuple):
    """Unregister one of our names (a server that is gone has forgotten it anyway)."""

    name: str


class WaitForSlot(NamedTuple):
    """Wait up to *timeout* seconds for the pool to have a slot (or to retire): outcome a bool."""

    pool: Any
    timeout: float | None


class WaitForDevice(NamedTuple):
    """Wait until the device work before *event* has landed (copies into a slot before the
    server reads it, results before the caller gets them): outcome None.  The blocking
    driver synchronizes the event with the GIL released; the asyncio one polls it."""

    event: Any


class Pause(NamedTuple):
    """Let *seconds* pass (a request polling for room in the byte budget): outcome None."""

    seconds: float


class Send(NamedTuple):
    """Run an inference (with tritonclient's per-request *options*, a
    :class:`~._options.RequestOptions`, where given): outcome tritonclient's result object."""

    model: str
    version: str
    inputs: list
    outputs: list
    options: Any = None
    message: Any = None     # the same request, made ready to send (gRPC; see Transport.request_message)
    #: The request's :class:`~._claim.Claim`: the driver marks it unanswered as it sends (so a
    #: request given up on is known to be on the server, and one never sent is not).
    claim: Any = None


class StreamSend(NamedTuple):
    """Send a request on the client's inference stream (gRPC only): outcome its
    :class:`~._stream.Streamed` entry, whose responses arrive in its inbox.

    *stream*, when given, is the stream to send it on instead (anything with
    ``send(message) -> Streamed``: tritonshm.grpc's stream, whose responses go to its
    caller's callback); *outputs* are then sent as they are (tritonclient's
    ``InferRequestedOutput`` objects, or None for every output)."""

    model: str
    version: str
    inputs: list
    outputs: list | None
    options: Any = None
    claim: Any = None       # as Send's
    stream: Any = None


class NextResponse(NamedTuple):
    """Wait up to *timeout* seconds (None: for ever) for the next response of a streamed
    request: outcome a :class:`~._stream.StreamResponse`."""

    entry: Any
    timeout: float | None


class Emit(NamedTuple):
    """Hand *value* (one response of a streamed request) to the caller, and go on when
    it asks for the next: outcome None.  Only a driver's ``iterate`` takes this step."""

    value: Any


Steps = Generator[Any, Any, Any]


@dataclasses.dataclass(frozen=True)
class Done:
    """What :func:`advance` returns once the steps have finished."""

    value: Any


def advance(steps: Steps, outcome: Any = None, failure: BaseException | None = None) -> Any:
    """Hand the last step's *outcome* (or *failure*) to *steps*: the next
    step, or :class:`Done` with their result.

    A failure the steps raise again leaves with this frame in its traceback: the frame must not
    hold it too, or the two make a cycle that keeps every frame of the request -- its lease, the
    caller's tensors -- alive until the garbage collector happens to run (a slot out of its pool
    meanwhile; with one slot, the next request waits and fails)."""
    try:
        return steps.throw(failure) if failure is not None else steps.send(outcome)
    except StopIteration as stop:
        return Done(stop.value)
    except BaseException:
        failure = None
        raise
