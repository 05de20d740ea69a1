"""One request's hold on everything the server may touch, and the one place that lets go of it.

A request names memory that the server reads or writes: its slot (a
:class:`~._pool.Lease`), and the caller's GPU tensors it lends (:mod:`._lent`:
inputs read where they are, ``out=`` results written where they are).
:class:`Claim` holds all of it for one request, and :meth:`Claim.end` decides,
for every path a request can end by, when it is let go of:

* **the server is done with it** -- it answered (a result, or an error it sent),
  or the request never reached it (no connection carried it): the slot goes
  back, the lent allocations are one request less busy, the tensors go with the
  claim;
* **the outcome is unknown** (``client_timeout``, a cancelled aio call, a stream
  that ended first, a connection that broke, a gateway's 502/503/504, a
  ``close()`` that stopped waiting): the server may still run the request, read
  its inputs and write its outputs.  Its slot is held for the server: the slot's
  extent leaves leasing until an unregister of it succeeds (Triton refuses to
  unregister a region a running request uses; a restarted server holds nothing),
  then comes back whole (:meth:`~._pool.SlotPool.hold_for_server`,
  :meth:`~._disposal.Disposals.prove_steps`).  Each lent allocation is taken out of
  the lent table, to be unregistered, and the registration holds the request's
  tensors until the server lets go of it, so torch cannot hand their blocks to
  another tensor meanwhile (:meth:`~._lent.LentAllocations.abandon`); a view of one
  of the client's own slots is held by that slot's extent likewise.

Which failure is which is :func:`tritonshm.errors.outcome_of`'s one table
(:data:`~tritonshm.errors.OUTCOMES`); :meth:`Claim.ended_by` reads it.

:class:`Claims` is the engine's register of the caller's GPU memory that
unfinished requests name (*spans*).  A request that would write where one of
them may read or write, or read where one may write, waits for it: checking
and entering the register are one step under one lock (:meth:`Claims.enter`),
so two requests writing one ``out=`` never run at once, and a retry into the
same ``out=`` tensor after a timeout never races the late write of the request
it replaces.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import Outcome, outcome_of
from ._devices import DeviceTensor, Span
from ._lent import Lent, LentAllocations
from ._pool import Extent, Lease

__all__ = ["Claim", "Claims"]


class Claim:
    """Everything the server may touch for one request (see the module): its *lease* (set by
    the engine when it leases a slot; *owns_lease* False: a zero-copy request's, which outlives
    its runs), the tensors it lends by name, the events of the work the caller had queued on
    them (waited for before the request is sent), where in the caller's memory it reads and
    writes (*spans*, entered in :class:`Claims` before anything is lent), and whether it was
    sent and the server may still run it (*unanswered*: set by the driver as it sends; or
    *sent_twice*, whatever the answer)."""

    __slots__ = ("lease", "owns_lease", "inputs", "outputs", "waits", "tensors", "spans", "unanswered",
                 "sent_twice", "after", "_claims", "_allocations")

    def __init__(self, claims: "Claims", allocations: LentAllocations) -> None:
        self._claims = claims
        self._allocations = allocations
        self.lease: Lease | None = None
        self.owns_lease = True
        self.inputs: dict[str, Lent] = {}     # inputs read where they are
        self.outputs: dict[str, Lent] = {}    # out= results written where they are
        self.waits: list[Any] = []
        # The lent tensors (their captures hold their memory), each with whether it is written.
        self.tensors: list[tuple[DeviceTensor, bool]] = []
        self.spans: list[Span] = []  # the caller's memory the request names, while it runs
        self.unanswered = False  # sent, and neither answered nor refused by the server yet
        # It went out twice -- HTTP/1.1 sends an idempotent request again on a fresh connection
        # when a kept one was reset before any byte of an answer came, which most likely means
        # the server closed it unread; but a proxy that forwarded it before the reset leaves the
        # first copy running on the server, still writing the slot after the second's answer.
        # So it is held for the server as if unanswered (a rare case: the proof costs little).
        self.sent_twice = False
        # The copies out of the slot, queued and not waited for on the CPU (a Pending): the slot
        # goes back to its pool only once they are complete.
        self.after: Any = None

    def went_out_again(self) -> None:
        """The wire sent the request once more (see :attr:`sent_twice`); any thread."""
        self.sent_twice = True

    @property
    def server_may_run_it(self) -> bool:
        """Whether the server may still read or write what the request named."""
        return self.unanswered or self.sent_twice

    def ended_by(self, exc: BaseException) -> None:
        """Sending the request raised *exc*: the server is done with it unless the outcome is
        unknown (:func:`~tritonshm.errors.outcome_of`, the one table)."""
        if outcome_of(exc) is not Outcome.UNKNOWN:
            self.unanswered = False

    def lend(self, name: str, where: Lent, tensor: DeviceTensor, writes: bool) -> None:
        """*tensor* is named where it is (*where*) as input (or, *writes*, result) *name*."""
        (self.outputs if writes else self.inputs)[name] = where
        self.tensors.append((tensor, writes))
        self.waits.append(tensor.source.event)

    def lent_spans(self) -> list[Span]:
        """Where the lent tensors are."""
        return [Span.of(tensor, writes) for tensor, writes in self.tensors]

    def end_lease(self) -> None:
        """Let go of the slot (the rest stays claimed): if the server is done with the request,
        back to its pool (or, leased with a handle, once the views of it are gone; a zero-copy
        request's stays with it); else held for the server (:meth:`~._pool.SlotPool.hold_for_server`)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        if self.unanswered or self.sent_twice:  # (server_may_run_it, written out: every request ends here)
            lease.pool.hold_for_server(lease)
        elif not self.owns_lease:
            return
        elif lease.handle is None:
            # results were copied out (or are being: *after*): nothing else holds the slot
            lease.pool.finished_and_back(lease, self.after)
        else:
            lease.pool.finished(lease)  # its views hold it, and bring it back when they die
        if self.owns_lease:
            # What holds the slot from now on is the views of it, not the lease record, which a
            # failure's traceback keeps (in its frames) for as long as the caller keeps the failure.
            lease.handle = None

    def end(self) -> None:
        """The request is over for the client: let go of what the server is done with, and hand
        what it may still touch to what holds it until the server provably lets go (idempotent)."""
        if self.lease is not None:
            self.end_lease()
        if not self.tensors:  # nothing lent (the quick path's claim: a slot only)
            if self.spans:
                self._claims.settle(self)
            return
        lent = [*self.inputs.values(), *self.outputs.values()]
        if not (self.unanswered or self.sent_twice):  # (server_may_run_it, written out: every lent request ends here)
            self._allocations.finished(lent)
            self._claims.settle(self)
        else:
            tensors = [t for t, _ in self.tensors]
            extents = []
            for where in lent:
                pool = where.extent.pool
                if pool is not None:  # a view of one of our own slots: held by its extent
                    pool.keep_for_server(where.extent, tensors)
                    extents.append(where.extent)
                else:
                    extents.append(self._allocations.abandon(where, tensors))
            self._claims.abandon(self, extents)
        self.inputs, self.outputs, self.tensors, self.waits = {}, {}, [], []


class Claims:
    """The caller's memory that unfinished requests name (see the module).

    A request is here from before it lends anything until it ends with the server done with
    it, or -- the outcome unknown -- until every registration that holds its lent tensors is
    let go of (the server let go of it: see :meth:`Claim.end`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Claim] = set()
        self._abandoned: list[tuple[list[Span], list[Extent]]] = []

    @property
    def busy(self) -> bool:
        """Whether any unfinished request names the caller's memory (cheap: no lock)."""
        return bool(self._running or self._abandoned)

    def enter(self, claim: Claim, spans: list[Span]) -> Span | None:
        """Enter *claim* as naming *spans*, unless one of them clashes with memory another
        unfinished request names: then that span, and nothing entered (wait, and try again).
        One step under the lock: no other request can enter a clashing span in between."""
        with self._lock:
            if self._abandoned:
                self._forget_released()
            for span in spans:
                for other in self._running:
                    if other is not claim and any(span.clashes(theirs) for theirs in other.spans):
                        return span
                for theirs, _ in self._abandoned:
                    if any(span.clashes(one) for one in theirs):
                        return span
            claim.spans = spans
            self._running.add(claim)
            return None

    def settle(self, claim: Claim) -> None:
        """The server is done with *claim*'s request: its memory is free."""
        with self._lock:
            self._running.discard(claim)
        claim.spans = []

    def abandon(self, claim: Claim, extents: list[Extent]) -> None:
        """The outcome of *claim*'s request is unknown: its lent memory stays named until
        *extents* (the registrations holding it) are let go of."""
        spans = claim.lent_spans()
        with self._lock:
            self._running.discard(claim)
            if spans and extents:
                self._abandoned.append((spans, extents))
        claim.spans = []

    def awaiting(self) -> int:
        """Requests whose outcome is unknown whose lent memory the server may still touch."""
        with self._lock:
            self._forget_released()
            return len(self._abandoned)

    def _forget_released(self) -> None:
        # Under the lock.  An abandoned request is over once each registration naming its
        # memory has been let go of (unregistered, or a slot's extent proven: the server no
        # longer uses it).
        if self._abandoned:
            self._abandoned = [(spans, extents) for spans, extents in self._abandoned
                               if not all(e.released_by_server for e in extents)]
