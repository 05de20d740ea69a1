"""One request's hold on everything the server may touch, and the one place that lets go of it.

A request names memory that the server reads or writes: its slot (a
:class:`~._pool.Lease`), and the caller's GPU tensors it lends (:mod:`._lent`:
inputs read where they are, ``out=`` results written where they are).
:class:`Claim` holds all of it for one request, and :meth:`Claim.end` decides,
for every path a request can end by, when it is let go of:

* **the server answered** (a result, or an error it sent): nothing of the
  request runs on the server any more -- the slot goes back, the lent
  allocations are one request less busy, the tensors go with the claim;
* **the client gave up without an answer** (``client_timeout``, a cancelled
  aio call, a stream that ended first, a server that stopped answering, a
  ``close()`` that stopped waiting): the server may still run the request, read
  its inputs and write its outputs.  The slot stays out of its pool; each lent
  allocation is taken out of the lent table, to be unregistered, and the
  registration holds the request's tensors until the server lets go of it --
  Triton refuses to unregister a region a running request uses, and a
  restarted or vanished server holds nothing -- so torch cannot hand their
  blocks to another tensor meanwhile (:meth:`~._lent.LentAllocations.abandon`).

:class:`Claims` is the engine's register of the caller's GPU memory that
unfinished requests name (*spans*).  A request that would write where one of
them may read or write, or read where one may write, waits for it
(:meth:`Claims.conflict`): a retry into the same ``out=`` tensor after a timeout
never races the late write of the request it replaces.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from ..errors import RegistrationError, ServerError, ServerTimeout, ServerUnavailable
from ._devices import DeviceTensor
from ._lent import Lent, LentAllocations
from ._pool import Extent, Lease

__all__ = ["Claim", "Claims", "Span", "server_answered"]

# Statuses of failures that are not the server's answer to the request: the client gave up, or
# lost the connection (the server may run the request all the same).
_NOT_ANSWERS = ("CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE")


def server_answered(exc: BaseException) -> bool:
    """Whether the failure *exc* of a sent request is the server's answer to it (then the
    server is done with the request), rather than the client giving up or losing it."""
    if isinstance(exc, RegistrationError):  # refused before it ran, or an output too large
        return True
    if not isinstance(exc, ServerError) or isinstance(exc, (ServerTimeout, ServerUnavailable)):
        return False
    status = exc.status()
    return status is not None and not any(word in status for word in _NOT_ANSWERS)


class Span(NamedTuple):
    """Bytes ``[start, end)`` of the caller's memory on *device* that a request names; *writes*:
    the server writes them (an ``out=`` result), else it reads them."""

    device: int
    start: int
    end: int
    writes: bool

    @classmethod
    def of(cls, tensor: DeviceTensor, writes: bool) -> "Span":
        """Where *tensor* is."""
        start = tensor.source.ptr + tensor.offset
        return cls(tensor.device, start, start + tensor.nbytes, writes)

    def clashes(self, other: "Span") -> bool:
        """Whether the two overlap and one of them is written (two readers never clash)."""
        return (self.writes or other.writes) and self.device == other.device \
            and self.start < other.end and other.start < self.end


class Claim:
    """Everything the server may touch for one request (see the module): its *lease* (set by
    the engine when it leases a slot), the tensors it lends by name, the events of the work the
    caller had queued on them (waited for before the request is sent), and whether it was sent
    and not yet answered."""

    __slots__ = ("lease", "inputs", "outputs", "waits", "tensors", "unanswered", "_claims", "_allocations")

    def __init__(self, claims: "Claims", allocations: LentAllocations) -> None:
        self._claims = claims
        self._allocations = allocations
        self.lease: Lease | None = None
        self.inputs: dict[str, Lent] = {}     # inputs read where they are
        self.outputs: dict[str, Lent] = {}    # out= results written where they are
        self.waits: list[Any] = []
        # The lent tensors (their captures hold their memory), each with whether it is written.
        self.tensors: list[tuple[DeviceTensor, bool]] = []
        self.unanswered = False  # sent, and neither answered nor refused by the server yet

    def lend(self, name: str, where: Lent, tensor: DeviceTensor, writes: bool) -> None:
        """*tensor* is named where it is (*where*) as input (or, *writes*, result) *name*."""
        (self.outputs if writes else self.inputs)[name] = where
        if not self.tensors:
            self._claims.add(self)
        self.tensors.append((tensor, writes))
        self.waits.append(tensor.source.event)

    def spans(self) -> list[Span]:
        """Where the lent tensors are."""
        return [Span.of(tensor, writes) for tensor, writes in self.tensors]

    def end_lease(self) -> None:
        """Let go of the slot (the rest stays claimed): back to its pool if the server answered
        (or, leased with a handle, once the views of it are gone); else kept out of it."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        if not self.unanswered:
            if lease.handle is None:
                lease.pool.finished_and_back(lease)  # results were copied out: nothing holds the slot
            else:
                lease.pool.finished()  # its views hold it, and bring it back when they die
            return
        # The server may still write the slot: it never comes back to its pool (it goes with its
        # extent, when the client closes); a held lease's handle is kept for the server with it.
        lease.pool.finished()
        if lease.handle is not None:
            lease.extent.kept_for_server.append(lease.handle)

    def end(self) -> None:
        """The request is over for the client: let go of what the server is done with, and hand
        what it may still touch to the registrations that hold it until it lets go (idempotent)."""
        if self.lease is not None:
            self.end_lease()
        if not self.tensors:  # nothing lent (the quick path's claim: a slot only)
            return
        lent = [*self.inputs.values(), *self.outputs.values()]
        if not self.unanswered:
            for where in lent:
                self._allocations.finished(where)
            self._claims.settle(self)
        else:
            extents = [self._allocations.abandon(where, [t for t, _ in self.tensors]) for where in lent]
            self._claims.abandon(self, extents)
        self.inputs, self.outputs, self.tensors, self.waits = {}, {}, [], []


class Claims:
    """The caller's memory that unfinished requests name (see the module).

    A request is here from its first lending until it ends answered, or -- the client gave
    up on it -- until every registration that holds its tensors is let go of (the server
    let go of it: see :meth:`Claim.end`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Claim] = set()
        self._abandoned: list[tuple[list[Span], list[Extent]]] = []

    @property
    def busy(self) -> bool:
        """Whether any unfinished request names the caller's memory (cheap: no lock)."""
        return bool(self._running or self._abandoned)

    def add(self, claim: Claim) -> None:
        """*claim* names the caller's memory from now on (:meth:`Claim.lend`)."""
        with self._lock:
            self._running.add(claim)

    def conflict(self, span: Span, claim: Claim) -> bool:
        """Whether another unfinished request names memory that clashes with *span*."""
        with self._lock:
            self._forget_released()
            running = [other for other in self._running if other is not claim]
            abandoned = [spans for spans, _ in self._abandoned]
        return any(span.clashes(other) for owner in running for other in owner.spans()) \
            or any(span.clashes(other) for spans in abandoned for other in spans)

    def settle(self, claim: Claim) -> None:
        """*claim*'s request was answered: its memory is free."""
        with self._lock:
            self._running.discard(claim)

    def abandon(self, claim: Claim, extents: list[Extent]) -> None:
        """The client gave up on *claim*'s request: its memory stays named until *extents* (the
        registrations holding it) are let go of."""
        spans = claim.spans()
        with self._lock:
            self._running.discard(claim)
            if spans and extents:
                self._abandoned.append((spans, extents))

    def awaiting(self) -> int:
        """Requests the client gave up on whose memory the server may still touch."""
        with self._lock:
            self._forget_released()
            return len(self._abandoned)

    def _forget_released(self) -> None:
        # Under the lock.  An abandoned request is over once each registration naming its
        # memory has been let go of (unregistered: the server no longer uses it).
        if self._abandoned:
            self._abandoned = [(spans, extents) for spans, extents in self._abandoned
                               if not all(e.memory.closed for e in extents)]
