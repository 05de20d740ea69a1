"""How far a client has fallen back: the transport state machine (sans-I/O).

A client starts on the memory its transport names and steps down, each step once and for the
client's life, as the server shows what it cannot open::

    as configured --(the server refuses a CUDA slot)--> host slots for GPU tensors too
                  --(the server refuses a host slot)--> the wire (plain gRPC / HTTP)

and, beside it, lending: the caller's GPU tensors registered where they are, until the server
refuses one (then they are copied into slots; a refused CUDA slot ends lending too).  Each step
of ``transport="auto"`` comes with one warning; ``"shm"`` refuses to leave shared memory and
``"cuda"`` refuses to leave CUDA memory (the refusal is raised instead), as does a caller that
asked for memory of one kind (*strict*).  ``"wire"`` starts at the wire.

Beside the steps, a request for whose slot /dev/shm has no room goes on the wire too, that
request only: the next one tries the slots again (room may have come free).  The client warns
of it once in its life (:meth:`Fallback.no_room`); ``"shm"`` and ``"cuda"`` raise instead.

:class:`Fallback` holds this state and is its only writer: the engine reads it (``wire``,
``cuda_refused``, ``lending_refused``) and reports each refusal to :meth:`Fallback.refused` /
:meth:`Fallback.lending_refused`, whose answer says what to do.  Tested step by step without
a server (tests/client/test_fallback.py), as h11 tests its ``ConnectionState``.
"""

from __future__ import annotations

import enum
import threading
from typing import NamedTuple

__all__ = ["Fallback", "Next", "Step"]


class Next(enum.Enum):
    """What a request whose memory the server refused does next."""

    RAISE = "raise"          #: the refusal is the caller's error (the transport, or the caller, insists)
    HOST = "host"            #: try again on host slots (GPU tensors copied there)
    WIRE = "wire"            #: send on the wire (plain gRPC / HTTP)


class Step(NamedTuple):
    """The answer to a refusal: what to do, and the warning to give (None: none -- an earlier
    refusal took this step already, or there is nothing to say)."""

    next: Next
    warning: str | None = None


class Fallback:
    """One client's transport state (see the module).  Thread-safe: concurrent first requests
    may each be refused; the first one to report it takes the step and gets the warning."""

    def __init__(self, transport: str, protocol: str):
        self.transport = transport
        self._protocol = protocol          # "gRPC" or "HTTP": what the wire is, for the warning
        self._lock = threading.Lock()
        # Read by the engine on every request: plain attributes (a read is not a call), written
        # only by the methods below.
        #: Requests go on the wire: the transport says so, or the server refused host slots.
        self.wire = transport == "wire"
        #: Why the server cannot open our CUDA slots (GPU tensors then go through host slots), or None.
        self.cuda_refused: str | None = None
        #: Why the server cannot open the caller's GPU memory (its tensors are then copied into
        #: slots), or None.
        self.lending_refused: str | None = None
        self._warned_no_room = False  # /dev/shm had no room for a slot once: warned of

    def refused(self, on_gpu: bool, why: str, strict: bool = False) -> Step:
        """The server refused a slot of ours, in GPU memory (*on_gpu*) or host memory, saying
        *why*; *strict*: the caller asked for exactly that memory.  What to do next."""
        with self._lock:
            if on_gpu:
                if self.transport == "cuda" or strict:
                    return Step(Next.RAISE)
                first = self.cuda_refused is None
                if first:
                    self.cuda_refused = why
                    self.lending_refused = self.lending_refused or why  # nor the caller's own GPU memory
                return Step(Next.HOST, f"tritonshm: GPU tensors fall back to pinned system shared memory: {why}"
                            if first else None)
            if self.transport in ("shm", "cuda") or strict:
                return Step(Next.RAISE)
            first = not self.wire
            self.wire = True
            return Step(Next.WIRE, f"tritonshm: falling back to plain {self._protocol}: {why}" if first else None)

    def no_room(self, why: str, strict: bool = False) -> Step:
        """/dev/shm has no room for a slot of ours, *why* in words (statvfs said so, or the
        kernel: ENOSPC); *strict*: the caller asked for that memory.  The request goes on the
        wire -- it alone: no step is taken -- with a warning the first time in the client's life."""
        with self._lock:
            if self.transport in ("shm", "cuda") or strict:
                return Step(Next.RAISE)
            first, self._warned_no_room = not self._warned_no_room, True
        return Step(Next.WIRE, f"tritonshm: {why}. Until there is room, such requests go on plain "
                               f"{self._protocol} (each tries the slots first; said once)" if first else None)

    def lending_refused_because(self, why: str) -> None:
        """The server refused a GPU allocation of the caller's: its tensors are copied from now on
        (counted in the client's stats, no warning: the slots still carry them)."""
        with self._lock:
            if self.lending_refused is None:
                self.lending_refused = why

    def describe(self) -> str:
        """The state in a word, for the client's repr: the transport, or ``"wire"``."""
        return "wire" if self.wire else self.transport
