"""A request's steps: lend, lease, fill, send, heal, stream-send -- and the quick path.

:class:`Runner` writes every request of a client as sans-I/O steps (:mod:`._steps`) over the
state its :class:`~._engine.Engine` holds (pools, the lent table, the claims, the fallback):
an ``infer`` call (:meth:`Runner.infer_steps`: the quick path, or planned chunks), a streamed
request, a zero-copy request's lease and run.  Each client holds one beside its engine and
drives the steps its own way.  What the server may touch for a request -- its slot, the
tensors it lends -- is held by the request's :class:`~._claim.Claim` and let go of in one
place (:meth:`Runner._end_claim`).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from ..errors import (ClientClosed, DecoupledModel, DTypeMismatch, ModelChanged, NameMismatch, OutputTooSmall,
                      RegionNotRegistered, ServerError, ShapeMismatch, SharedMemoryRefused, TensorInUse)
from . import _bytes, _devices, _intake, _messages, _results
from ._claim import Claim
from ._devices import DeviceTensor, OutTensor, Placement, Span
from ._engine import Engine
from ._fallback import Next
from ._model import ModelInfo
from ._options import RequestOptions
from ._plan import Plan
from ._pool import Lease, SlotPool, register_again_steps
from ._slots import SYSTEM, SlotKind, SlotMemory
from ._steps import Emit, NextResponse, Pause, Send, Steps, StreamSend, WaitForDevice

__all__ = ["InferRun", "Runner"]

# The server's refusals of a tensor the client named from the model's metadata (it changed since),
# of a request the model's config no longer takes (a smaller max_batch_size; made decoupled), and of
# the model itself (unloaded: the next call reads it again, and says so).
_STALE_METADATA = re.compile(r"unexpected inference (input|output)|unexpected datatype|unexpected shape for input|"
                             r"data-type is '[^']*', but model '[^']*' expects|"
                             r"expected \d+ inputs? but got|batch-size must be <=|"
                             r"doesn't support models with decoupled transaction policy|"
                             r"unknown model|is not found|is not ready", re.IGNORECASE)
def _stale(exc: ServerError) -> bool:
    """Whether *exc* says that the model is not what the client read (see _STALE_METADATA)."""
    return isinstance(exc, ModelChanged) or _STALE_METADATA.search(str(exc)) is not None


#: The client's own refusals of a request, read against what it knew of the model: a model that
#: changed under it (an input renamed, a datatype or shape changed, decoupled no longer) is read
#: again before they hold (:meth:`Runner.replanned_steps`).
PLAN_REFUSALS = (NameMismatch, DTypeMismatch, ShapeMismatch, DecoupledModel)
_GROW_ATTEMPTS = 3  # runs of one request while growing undersized outputs
_CLASH_POLL = 0.005  # how often a request waiting for clashing memory to be let go of looks again
_NAMES: Any = object()  # a streamed request asks for its plan's outputs by name (not for objects given)
_QUICK_BYTES = 1 << 20  # requests up to this many input bytes may take the quick path
_QUICK_PLANS = 256      # quick plans kept (one per model, outputs and input shapes and dtypes)


class InferRun(NamedTuple):
    """An ``infer`` call's steps (:meth:`Runner.infer_steps`): one :class:`Steps` per chunk, to be
    driven at once where there are several, and *join*, which makes the call's result of
    theirs (None: one chunk, whose result is the call's)."""

    steps: list[Steps]
    join: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None



class QuickPlan:
    """A small request seen before, checked then: the same model, outputs and input dtypes
    and shapes need no checking, planning or routing again (see :meth:`Runner.quick_steps`)."""

    __slots__ = ("plan", "key", "needs", "pool", "outputs")

    def __init__(self, plan: Plan, key: tuple[str, str, SlotKind], needs: dict[str, int],
                 outputs: Sequence[str] | None = None):
        self.plan = plan    # the plan made when it was first seen (its chunk: those inputs)
        self.outputs = outputs  # the outputs the call asked for (None: all), to plan it again
        self.key = key      # its pool's key
        self.needs = needs  # what a slot of that pool must hold
        self.pool: SlotPool | None = None  # the pool it leased from last, while in service and fitting


class _QuickSlot(NamedTuple):
    """One slot made ready for quick requests of some input shapes: views of its inputs and
    of its outputs' bytes, and request objects of its own with their message (see
    :func:`._messages.own_request`)."""

    inputs: list[tuple[str, np.ndarray]]
    outputs: list[tuple[str, Any, np.ndarray]]
    request: tuple[list, list, Any]


def _callers_tensors(arrays: Mapping[str, Any],
                     out: Mapping[str, OutTensor] | None) -> list[tuple[str, DeviceTensor, bool]]:
    """The tensors of a request in the caller's GPU memory, as ``(name, tensor, writes)``: each
    GPU input, then each ``out=`` tensor (the server writes those) -- none empty (Triton refuses
    0-byte bindings) and no host array (those are the client's own copies)."""
    tensors = [(name, array, False) for name, array in arrays.items()
               if isinstance(array, DeviceTensor) and array.nbytes]
    if out:
        for name, given in out.items():
            if given.tensor.nbytes:
                tensors.append((name, given.tensor, True))
    return tensors


class Runner:
    """The steps of every request of one client, over its *engine*'s state (see the module)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        # What the steps read on every request, held here too (the engine never replaces them).
        self.wire = engine.wire
        self.fallback = engine.fallback
        self.pool_table = engine.pool_table
        self.lent_table = engine.lent_table
        self.claims = engine.claims
        self.disposals = engine.disposals
        self.planner = engine.planner
        self._flight = engine.in_flight  # one request in flight while entered (reusable)
        self._quick_plans: dict[tuple, QuickPlan] = {}  # small requests seen before, by signature
        self._device_plans: dict[tuple, Plan] = {}  # GPU requests seen before (their plans, without tensors)
        #: The ready messages of requests whose every tensor is lent (no slot to keep them on), by
        #: model, shapes, outputs and where the tensors are (:func:`._messages.slot_request`).
        self._lent_messages: dict[tuple, Any] = {}

    def chunk_steps(self, plan: Plan, arrays: Mapping[str, Any], rows: _results.Rows | None = None) -> Steps:
        """Steps of one chunk of *plan* (its *arrays* fit a slot): lease, copy in, run,
        collect (fixed-size outputs into *rows* of a chunked batch's results, when given).

        What the server may touch -- the slot, the tensors lent -- is held by the chunk's
        :class:`~._claim.Claim`, which lets go of it when the chunk ends: at once if the
        server answered, else once the server lets go of it."""
        with self._flight:
            claim = Claim(self.claims, self.lent_table)
            try:
                outputs = yield from self._chunk_attempts(plan, arrays, rows, claim)
            except GeneratorExit:  # closed (a cancelled aio call): no more steps may be taken
                self._end_claim(claim)
                raise
            except BaseException:
                self._end_claim(claim)
                if self.engine.closed:  # nobody else will: what the request left, unregistered now
                    yield from self.engine.dispose_steps()
                raise
            self._end_claim(claim)
            if self.disposals.maybe_due:
                yield from self.engine.settle_steps()  # what the finished request left idle
            return outputs

    def _end_claim(self, claim: Claim) -> None:
        """The one place a request's claim ends (see :mod:`._claim`)."""
        if claim.unanswered:
            self.lent_table.count_abandoned()
        claim.end()

    def _chunk_attempts(self, plan: Plan, arrays: Mapping[str, Any], rows: _results.Rows | None,
                        claim: Claim) -> Steps:
        info, names, route = plan.info, plan.names, plan.route
        shapes = {name: array.shape for name, array in arrays.items()}
        bytes_sizes = _intake.bytes_sizes(info, arrays) if info.has_bytes else {}
        tensors = _callers_tensors(arrays, plan.out)
        waiting = self._enter_claims(plan, tensors, claim)
        if waiting is not None:
            yield from waiting
        lending = route.lent and not self.fallback.wire  # (a server that refused CUDA memory: the table says so)
        registering = self._lend(tensors, claim) if lending else None
        if registering is not None:
            yield from registering
        needs = self.pool_table.needs(info, shapes, bytes_sizes)
        if claim.tensors:  # lent tensors take no room in a slot
            needs = {name: size for name, size in needs.items()
                     if name not in claim.inputs and name not in claim.outputs}
        # Our CudaArray results are the slot the server wrote them in, held by them, where the pool
        # has a free slot to spare meanwhile (keeping results never leaves the others none): no copy
        # out after the answer, no event.  Else they are copied out as the caller asked.
        in_place_wanted = rows is None and plan.results_in_place
        for attempt in range(_GROW_ATTEMPTS):
            lease, in_place = None, False
            if needs or self.fallback.wire:
                if not self.fallback.wire:
                    if in_place_wanted:
                        lease = self.pool_table.lease_now(info, needs, route.memory, True, spare=1)
                        in_place = lease is not None
                    if lease is None:
                        lease = self.pool_table.lease_now(info, needs, route.memory, not plan.copy)
                    if lease is None:  # (no free slot at hand: the steps wait or grow)
                        lease = yield from self.pool_table.lease_steps(info, needs, plan.slot_timeout, not plan.copy,
                                                                       route.memory)
                if lease is None:
                    self._count_wire_copies(arrays, plan.out, claim if lending else None)
                    inputs, requested = _messages.wire_request(self.wire, info, arrays, names)
                    result = yield Send(info.name, info.version, inputs, requested, plan.options)
                    outputs = _results.wire_results(info, result, names, route.results, rows)
                    return _results.into_out(info, outputs, plan.out)
            claim.lease = lease
            try:
                stream = yield from self._fill_steps(info, lease, arrays, bytes_sizes, route.device, claim)
                outputs = yield from self.slot_steps(info, lease, shapes, names, plan.copy and not in_place,
                                                     bytes_sizes, route.results, rows, stream,
                                                     options=plan.options, claim=claim, out=plan.out)
            except OutputTooSmall as exc:
                # A variable-size output outgrew its guess: grow to what the server asked for
                # and run again on a slot of a larger pool -- unless running it again would do
                # harm (Triton says so after the model ran; a sequence's state would advance
                # twice) or cannot help (the caller's out= tensor was the room, lent, or is
                # smaller than the output: an out= copied from the slot only needs a larger slot).
                given = None if plan.out is None or exc.output is None else plan.out.get(exc.output)
                if given is not None and (exc.output in claim.outputs or exc.needed is None
                                          or exc.needed > given.tensor.nbytes):
                    raise _results.out_too_small(info, exc, given) from None
                if exc.output not in needs or exc.needed is None or attempt + 1 == _GROW_ATTEMPTS \
                        or not (plan.options is None or plan.options.may_run_twice):
                    raise
                needs = {**needs, exc.output: exc.needed}
                if not bytes_sizes:  # (remembered: requests of these shapes start on a slot this large)
                    self.pool_table.outgrown(info, shapes, exc.output, exc.needed)
                claim.end_lease()
                continue
            except SharedMemoryRefused as exc:  # (healing: the restarted server cannot open our memory)
                if lease is None or attempt + 1 == _GROW_ATTEMPTS \
                        or not self._heal_refused(lease.pool, exc, strict=not plan.copy):
                    raise  # (no lease: lent tensors refused -- copied from the next request on)
                claim.end_lease()  # (refused before it ran: back to its pool, out of service now)
                continue  # on the wire
            finally:
                del lease  # now, not when a traceback holding this frame dies
            if claim.tensors:
                self.lent_table.count(len(claim.inputs), len(claim.outputs))
            return outputs
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _enter_claims(self, plan: Plan, tensors: Sequence[tuple[str, DeviceTensor, bool]],
                      claim: Claim) -> Steps | None:
        """Enter *claim* as naming the caller's GPU memory the request reads and writes (*tensors*:
        :func:`_callers_tensors`); None when
        it is in (the usual case: no steps), else the steps that wait until no unfinished request
        names memory this one writes, or writes what this one reads (a request the client gave up
        on, still running on the server) -- :class:`TensorInUse` after the request's slot_timeout."""
        spans = []
        for _, tensor, writes in tensors:
            spans.append(Span.of(tensor, writes))
        if not spans:  # (host tensors are the client's copies: nothing to clash)
            return None
        # Checked and entered in one step: a request starting meanwhile sees these.
        clash = self.claims.enter(claim, spans)
        return None if clash is None else self._wait_for_clashes(plan, claim, tensors, spans, clash)

    def _wait_for_clashes(self, plan: Plan, claim: Claim, tensors: Sequence[tuple[str, DeviceTensor, bool]],
                          spans: list[Span], clash: Span | None) -> Steps:
        """:meth:`_enter_claims`' wait: until *claim* enters *spans*, where *tensors* are (*clash*:
        the first in the way)."""

        def entered() -> bool:
            nonlocal clash
            clash = self.claims.enter(claim, spans)
            return clash is None

        def timed_out() -> TensorInUse:
            name, writes = next((name, writes) for (name, _, writes), span in zip(tensors, spans) if span is clash)
            what = f"out[{name!r}]" if writes else f"input {name!r}"
            return TensorInUse(
                f"{what} of this request on model {plan.info.name!r} is memory another request still "
                f"uses: one running now, or one the client gave up on (client_timeout, cancelled, "
                f"closed) that the server may still be running; waited slot_timeout={plan.slot_timeout} s "
                f"for it to be done. Wait longer (slot_timeout=), or give other tensors")

        yield from self._wait_until(entered, plan.slot_timeout, timed_out)

    def _count_wire_copies(self, arrays: Mapping[str, Any], out: Mapping[str, OutTensor] | None,
                           lending: Claim | None = None) -> None:
        """GPU inputs and ``out=`` tensors of a request on the wire are copied: counted (stats()) --
        after the *lending* claim's lend steps, only those it lent (the rest each counted a reason)."""
        if lending is None:
            copied = sum(isinstance(array, DeviceTensor) for array in arrays.values()) + len(out or ())
        else:
            copied = len(lending.inputs) + len(lending.outputs)
        if copied:
            self.lent_table.count_copied("on the wire", copied)

    def _lend(self, tensors: Sequence[tuple[str, DeviceTensor, bool]], claim: Claim) -> Steps | None:
        """Lend the server a request's GPU inputs, and the results the caller allocated (*tensors*:
        :func:`_callers_tensors`), where their memory can be (:mod:`._lent`); the rest is copied as
        before.  Those whose allocation is known are lent now; None when that is all of them (the
        warm case: no steps), else the steps that register the rest."""
        unknown = []
        # An allocation lent before is known by its id -- never one of our slots in service:
        # own_slot() names a view of those (an input, or a result given as out=) before it could
        # be lent (the lent table would register the slot's memory again, and hold the slot).
        each = []
        for _, tensor, _ in tensors:  # (a loop: see lent_quick_steps)
            each.append(tensor)
        for (name, tensor, writes), where in zip(tensors, self.lent_table.lend_known(each)):
            if where is None:
                where = self.pool_table.own_slot(tensor)
            if where is None:
                unknown.append((name, tensor, writes))
            else:
                claim.lend(name, where, tensor, writes=writes)
        return self._lend_steps(unknown, claim) if unknown else None

    def _lend_steps(self, tensors: list[tuple[str, DeviceTensor, bool]], claim: Claim) -> Steps:
        """:meth:`_lend`'s registrations: each of *tensors* lent where its memory can be."""
        for name, tensor, writes in tensors:
            where = yield from self.lent_table.lend_steps(tensor)
            if where is not None:
                claim.lend(name, where, tensor, writes=writes)

    def _fill_steps(self, info: ModelInfo, lease: Lease | None, arrays: Mapping[str, Any],
                    bytes_sizes: Mapping[str, int], device: int | None, claim: Claim | None = None) -> Steps:
        """Copy *arrays* into the leased slot (BYTES serialized straight in) but those the
        *claim* lends; returns this thread's copy stream of the slot's (or *device*'s) GPU, None
        without one.  No lease: everything is lent.

        The copies run on that copy stream, after the event each captured input
        carries; the server reads the slot only once they have landed (one wait,
        never a device-wide sync).  Lent tensors are read (inputs) or written
        (results the caller allocated) by the server in place: the same wait
        covers the work the caller had queued on them when it called.
        """
        memory = None if lease is None else lease.extent.memory
        stream = None if memory is None else self._copy_stream(memory, device)  # (all lent: nothing to copy)
        queued = False
        waits = claim.waits if claim is not None else []
        try:
            for spec in info.inputs:
                if claim is not None and spec.name in claim.inputs:
                    continue
                assert lease is not None and memory is not None, "an input not lent has room in a slot"
                offset = lease.offset(spec.name)
                array = arrays[spec.name]
                if spec.is_bytes:
                    _bytes.encode_into(array, memory.bytes_at(offset, bytes_sizes[spec.name]))
                else:
                    queued |= stream is not None and (memory.kind == "cuda" or isinstance(array, DeviceTensor))
                    memory.write(offset, array, stream)
            if queued:  # one wait for the copies and the lent tensors' events alike
                assert stream is not None  # (what was queued went there)
                for event in _devices.distinct(waits):
                    stream.wait(event)
                yield WaitForDevice(_devices.ordering_event(stream.device).record(stream))
            else:  # nothing copied: wait for the lent tensors' events themselves (no GPU work queued):
                # one per producer stream, shared by the call's tensors (one ordering point)
                for event in _devices.distinct(waits):
                    yield WaitForDevice(event)
        except BaseException:
            if queued and stream is not None:
                stream.synchronize()  # nothing of ours may still land in the slot once it is back
            raise
        return stream

    def infer_steps(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None, copy: bool,
                    output_device: Any, slot_timeout: float | None, options: RequestOptions | None,
                    out: Mapping[str, Any] | None, rerun: bool = True) -> InferRun:
        """An ``infer`` call's steps, for either client: by the quick path when the request was
        seen before, else planned (and remembered for the quick path), one :class:`Steps` per
        chunk of a large batch -- to be driven at once -- and how their results join."""
        signature = None if out is not None else \
            self._quick_signature(info.name, info.version, inputs, outputs, copy, output_device, slot_timeout)
        quick = None if signature is None else self._quick_plans.get(signature)
        if quick is not None:  # seen before: checked then, planned then (it sees a changed model itself)
            return InferRun([self.quick_steps(quick, inputs, options)])
        device_signature = None
        if signature is None:
            # GPU tensors taken now, under one ordering point (once: a run again takes these), then
            # the plan of a call like this one seen before, where there is one: nothing checked or
            # routed again.
            inputs, out = _devices.capture_call(inputs, out)
            device_signature = self._device_signature(info, inputs, outputs, copy, output_device, slot_timeout, out)
        known = None if device_signature is None else self._device_plans.get(device_signature)
        if known is not None:  # (a Plan made whole: namedtuple's _replace costs two Python calls)
            chunk = {}
            for spec in info.inputs:
                chunk[spec.name] = inputs[spec.name]
            plan = Plan(info, [chunk], known.names, known.route, known.copy, known.slot_timeout, options, out)
        else:
            with _devices.one_ordering_point():  # whatever planning takes: one event per stream too
                plan = self.planner.plan(info, inputs, outputs, copy, output_device, slot_timeout, options,
                                         out=out)
        if signature is not None:
            self._remember_quick(signature, plan)
        elif device_signature is not None and known is None:
            self._remember_device_plan(device_signature, plan)
        again = None if not rerun else functools.partial(
            self._infer_again_steps, info.name, info.version, inputs, outputs, copy, output_device, slot_timeout,
            options, out)
        if len(plan.chunks) == 1:
            chunk = plan.chunks[0]
            lent = None if known is None else self._all_lent(plan, chunk)
            if lent is not None:
                return InferRun([self.lent_quick_steps(plan, chunk, lent, again)])
            return InferRun([self._changed_steps(self.chunk_steps(plan, chunk), info, again)])
        rows = _results.result_rows(info, plan.names, plan.chunks, plan.route.results)
        # (a batch in chunks is not run again: its joining follows the old plan)
        return InferRun([self._changed_steps(self.chunk_steps(plan, chunk, into), info)
                         for chunk, into in zip(plan.chunks, rows)],
                        functools.partial(_results.join_chunks, names=plan.names, placement=plan.route.results,
                                          rows=rows[0]))

    # -- the lent quick path: every tensor the caller's GPU memory, registered before ---------

    def _all_lent(self, plan: Plan, arrays: Mapping[str, Any]) -> list[tuple[str, DeviceTensor, bool]] | None:
        """The request's tensors (as :func:`_callers_tensors` gives them) where *plan*'s request
        names only the caller's GPU memory: every input a GPU tensor, every output asked for an
        ``out=`` tensor -- all of them to be lent, none empty; else None."""
        out = plan.out
        if out is None or not plan.route.lent or self.fallback.wire or len(out) != len(plan.names):
            return None
        tensors = []
        for name, array in arrays.items():
            if type(array) is not DeviceTensor or not array.nbytes:
                return None
            tensors.append((name, array, False))
        for name in plan.names:
            given = out.get(name)
            if given is None or not given.tensor.nbytes:
                return None
            tensors.append((name, given.tensor, True))
        return tensors

    def lent_quick_steps(self, plan: Plan, arrays: Mapping[str, Any], tensors: list[tuple[str, DeviceTensor, bool]],
                         again: Callable[..., Steps] | None) -> Steps:
        """A warm request of :meth:`_all_lent` *tensors*, each in an allocation the lent table
        registered before (known by the driver's id of it), as straight-line code -- the GPU twin
        of :meth:`quick_steps`: no slot, no copy, no registration; its claim entered, the call's
        one ordering point waited for, the kept message sent, the answer checked.  Where it is not
        that (a tensor not known yet, memory another request still uses) the full way
        (:meth:`chunk_steps`) waits and registers.  Ended as :meth:`chunk_steps` ends a chunk; a
        model that changed is read again and the request run *again* as :meth:`_changed_steps`
        does.

        (On this way, and in what it calls, loops rather than comprehensions: each comprehension
        is a function made and called per request, and what a warm request costs between a
        server's answers is mostly how much code it runs cold -- ``bench/client_overhead.py --gpu``.)"""
        if self.engine.closed:
            self.engine.check_open()
        info, out = plan.info, plan.out
        assert out is not None  # (_all_lent)
        outputs: dict[str, Any] | None = None
        changed: ServerError | None = None
        with self._flight:
            claim = Claim(self.claims, self.lent_table)
            try:
                # Entered and lent with no steps, or not taken: a clash to wait out, or a tensor to
                # register (what was lent stays in the claim, to end with it).
                if self._enter_claims(plan, tensors, claim) is None and self._lend(tensors, claim) is None:
                    for event in _devices.distinct(claim.waits):  # (one: the call's ordering point)
                        yield WaitForDevice(event)
                    shapes = {}
                    for name, array in arrays.items():
                        shapes[name] = array.shape
                    inputs, requested, message = _messages.slot_request(
                        self.wire, info, None, shapes, plan.names, {}, prepare=plan.options is None, lent=claim,
                        kept=self._lent_messages)
                    try:
                        result = yield from self._send_claimed(
                            Send(info.name, info.version, inputs, requested, plan.options, message, claim), claim)
                    except OutputTooSmall as exc:  # (the out= tensor was the room: no larger slot can help)
                        given = None if exc.output is None else out.get(exc.output)
                        if given is None:
                            raise
                        raise _results.out_too_small(info, exc, given) from None
                    outputs = _results.collect(info, None, result, plan.names, plan.copy, plan.route.results,
                                               lent=claim, allocated=out, ready=message)[0]
                    self.lent_table.count(len(claim.inputs), len(claim.outputs))
            except GeneratorExit:  # closed (a cancelled aio call): no more steps may be taken
                self._end_claim(claim)
                raise
            except BaseException as exc:
                self._end_claim(claim)
                if self.engine.closed:  # nobody else will: what the request left, unregistered now
                    yield from self.engine.dispose_steps()
                if not (isinstance(exc, ServerError) and _stale(exc)):
                    raise
                changed = exc  # (the model changed: read again below, as _changed_steps does)
            else:
                self._end_claim(claim)
                if outputs is None:  # not taken: the full way (in flight all along, as one request)
                    return (yield from self._changed_steps(self.chunk_steps(plan, arrays), info, again))
                if self.disposals.maybe_due:
                    yield from self.engine.settle_steps()  # what the finished request left idle
        if changed is not None:  # the model changed: read again, and run again where that is safe
            self.forget_model(info.name)
            try:
                if again is None:
                    raise changed
                return (yield from again(info, changed))
            finally:
                changed = None  # (see _steps.advance)
        return outputs

    # -- a model that changed under the client ------------------------------

    def _changed_steps(self, steps: Steps, info: ModelInfo, again: Callable[..., Steps] | None = None) -> Steps:
        """*steps*; if the answer shows that *info*'s model changed since the client read it --
        :class:`ModelChanged`, or the server refusing a tensor the metadata named ("unexpected
        inference output", a datatype or shape it no longer has) -- what the client knew of it is
        forgotten, and with *again* it is read again and the request run once more where that is
        safe (:meth:`_infer_again_steps`); else the error is raised as it is."""
        try:
            return (yield from steps)
        except ServerError as exc:
            if not _stale(exc):
                raise
            self.forget_model(info.name)
            if again is None:
                raise
            failure: ServerError | None = exc
        try:
            return (yield from again(info, failure))
        finally:
            failure = None  # (see _steps.advance)

    def _infer_again_steps(self, model: str, version: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
                           copy: bool, output_device: Any, slot_timeout: float | None,
                           options: RequestOptions | None, out: Mapping[str, Any] | None,
                           before: ModelInfo, failure: ServerError) -> Steps:
        """Read the model again and run the request once more: only where it may run twice (no
        sequence step, nothing ``idempotent=False``: the server may have run it), and where the
        model is not what it was (else the server's refusal was about the request: raised)."""
        info = yield from self.engine.model_steps(model, version)
        if info == before and not isinstance(failure, ModelChanged):
            raise failure
        if options is not None and not options.may_run_twice:
            raise ModelChanged(f"model {model!r} changed on the server since the client read it ({failure}); this "
                               f"request may not run twice (a sequence step, or idempotent=False), so it was not "
                               f"run again: call again to run it on the model as it is now",
                               status="model changed", model=model) from None
        # (once: if it changed again meanwhile, that run's error is raised)
        try:
            run = self.infer_steps(info, inputs, outputs, copy, output_device, slot_timeout, options, out,
                                   rerun=False)
        except PLAN_REFUSALS:
            raise failure from None  # the request does not fit the model as it is now: the server said why
        if run.join is None:
            return (yield from run.steps[0])
        raise ModelChanged(f"model {model!r} changed on the server since the client read it: a batch of this size "
                           f"now runs in chunks -- call again", status="model changed", model=model)

    def replanned_steps(self, info: ModelInfo, make: Callable[[ModelInfo], Any]) -> Steps:
        """``make(info)``: a plan of a request against what the client knew of the model; where that
        refuses it (one of :data:`PLAN_REFUSALS`: the model may have changed), ``make`` of the model
        read again (:meth:`reread_steps`: where nothing changed, the refusal stands).  No steps
        where the first holds.  (``infer`` writes this out: every request plans.)"""
        try:
            return make(info)
        except PLAN_REFUSALS as refusal:
            fresh = yield from self.reread_steps(info, refusal)
        return make(fresh)

    def reread_steps(self, info: ModelInfo, refusal: BaseException) -> Steps:
        """The model read again after the client refused a request against *info*, what it knew
        of it (*refusal*, one of :data:`PLAN_REFUSALS`): the model as it is now where it changed
        (what was known of it forgotten), else *refusal* is raised -- the request was wrong."""
        fresh = yield from self.engine.read_model_steps(info.name, info.version)
        if fresh == info:
            raise refusal
        self.forget_model(info.name)
        return self.engine.remember_model(fresh)

    def forget_model(self, model: str) -> None:
        """Forget what the client knew of *model*: its metadata, its quick plans, its pools
        (drained, then let go of): the next call reads it again."""
        self.engine.forget_model(model)
        # (list(): taken at once, while other threads may add to them)
        self._quick_plans = {key: plan for key, plan in list(self._quick_plans.items()) if key[0] != model}
        self._device_plans = {key: plan for key, plan in list(self._device_plans.items()) if key[0] != model}
        self._lent_messages = {key: kept for key, kept in list(self._lent_messages.items()) if key[0] != model}

    # -- the quick path -----------------------------------------------------

    def quick_steps_for(self, model: str, version: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
                        copy: bool, output_device: Any, slot_timeout: float | None,
                        options: RequestOptions | None) -> Steps | None:
        """An ``infer`` call's steps by the quick path (:meth:`quick_steps`) when it may take it
        and was seen before -- no model lookup, no checks, no plan: the caller's first call --
        else None (then :meth:`infer_steps`).  *options*: the call's, checked."""
        signature = self._quick_signature(model, version, inputs, outputs, copy, output_device, slot_timeout)
        quick = None if signature is None else self._quick_plans.get(signature)
        return None if quick is None else self.quick_steps(quick, inputs, options)

    def _quick_signature(self, model: str, version: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
                         copy: bool, output_device: Any, slot_timeout: float | None) -> tuple | None:
        """What makes a request the same as one seen before, when it may take the quick path (else
        None): small ones of plain numpy arrays on host slots, copied results where they were --
        the common case, where checking and planning again cost as much as the rest.  Options
        are not part of it: they travel with each request (a sequence's id changes every time)."""
        if not copy or output_device != "auto" or slot_timeout is not None or self.fallback.wire \
                or self.planner.routing.transport == "cuda" or len(inputs) > 8 or type(model) is not str:
            return None
        if outputs is not None and any(type(name) is not str for name in outputs):
            return None  # (the full way says what is wrong with them)
        signature: list[Any] = [model, version, None if outputs is None else tuple(outputs)]
        total = 0
        for name, array in inputs.items():
            if type(array) is not np.ndarray or not array.flags.c_contiguous:
                return None
            total += array.nbytes
            signature += (name, array.dtype, array.shape)
        return tuple(signature) if total <= _QUICK_BYTES else None

    def _remember_quick(self, signature: tuple, plan: Plan) -> None:
        """Keep *plan* for the requests of *signature*, if it is one the quick path can run: one
        chunk, host slots, results on the host, no BYTES."""
        info = plan.info
        if len(plan.chunks) != 1 or plan.route.memory != SYSTEM or plan.route.results.device is not None \
                or info.has_bytes or info.decoupled:
            return
        (arrays,) = plan.chunks
        needs = self.pool_table.needs(info, {name: array.shape for name, array in arrays.items()}, {})
        if len(self._quick_plans) >= _QUICK_PLANS:
            self._quick_plans.clear()
        self._quick_plans[signature] = QuickPlan(plan._replace(chunks=[]), (info.name, info.version, SYSTEM), needs,
                                                 signature[2])

    def _device_signature(self, info: ModelInfo, arrays: Any, outputs: Sequence[str] | None, copy: bool,
                          output_device: Any, slot_timeout: float | None,
                          out: Mapping[str, OutTensor] | None) -> tuple | None:
        """What makes a GPU request (its device inputs and ``out=`` tensors taken: *arrays*, *out*)
        the same as one seen before -- the model, outputs, each tensor's dtype, shape, device and
        library, where results go -- so that its plan holds again, checked and routed then; None
        for a request that is not such a one (no GPU tensor, BYTES, anything unusual: the full way
        checks it).  Where the tensors are is not part of it: each request lends its own."""
        if (type(arrays) is not dict and not isinstance(arrays, Mapping)) or len(arrays) > 8 or info.has_bytes \
                or info.decoupled or type(output_device) not in (str, int) \
                or not (slot_timeout is None or type(slot_timeout) in (int, float)):
            return None
        if outputs is not None and (isinstance(outputs, str) or any(type(name) is not str for name in outputs)):
            return None
        signature: list[Any] = [info.name, info.version, None if outputs is None else tuple(outputs), copy,
                                output_device, slot_timeout]
        gpu = bool(out)
        for name, array in arrays.items():
            if type(array) is DeviceTensor:
                signature += (name, array.dtype, array.shape, array.device, array.library)
                gpu = True
            elif type(array) is np.ndarray and array.flags.c_contiguous and array.dtype.kind not in "OSU":
                signature += (name, array.dtype, array.shape)
            else:
                return None
        for name, given in (out or {}).items():
            tensor = given.tensor
            signature += ("out", name, tensor.dtype, tensor.shape, tensor.device, tensor.source.readonly)
        return tuple(signature) if gpu else None

    def _remember_device_plan(self, signature: tuple, plan: Plan) -> None:
        """Keep *plan* (without its tensors) for the GPU requests of *signature*: one chunk only."""
        if len(plan.chunks) != 1:
            return
        if len(self._device_plans) >= _QUICK_PLANS:
            self._device_plans.clear()
        self._device_plans[signature] = plan._replace(chunks=[], options=None, out=None)

    def quick_steps(self, quick: QuickPlan, arrays: Mapping[str, Any], options: RequestOptions | None) -> Steps:
        """A request of a :class:`QuickPlan`: lease, copy in, send the slot's ready message (made
        with these *options* where there are any), copy out -- as straight-line code over what
        the plan and the slot keep.  What is not the common case (no free slot, a pool to make or
        grow, a server that forgot our regions, an output larger than its slot) goes the full
        way (:meth:`chunk_steps`), which handles it."""
        if self.engine.closed:
            self.engine.check_open()
        pool = quick.pool
        if pool is None or pool.retired:  # (a larger pool replaced it, or it went out of service)
            pool = quick.pool = self.pool_table.get(quick.key)
            if pool is not None and not pool.layout.fits(quick.needs):
                pool = quick.pool = None
        lease = None if pool is None else pool.try_acquire(False)
        if lease is None:
            return (yield from self._quick_the_full_way(quick, arrays, options))
        info = quick.plan.info
        outputs: dict[str, Any] = {}
        claim = Claim(self.claims, self.lent_table)  # its slot: kept out of the pool if given up on
        claim.lease = lease
        changed: ServerError | None = None
        with self._flight:
            try:
                slot = self._quick_slot(info, lease, arrays, quick.plan.names)
                for name, view in slot.inputs:
                    np.copyto(view, arrays[name])
                inputs, requested, message = slot.request
                try:
                    result = yield from self._send_claimed(Send(
                        info.name, info.version, inputs, requested, options, message if options is None else None,
                        claim), claim, heal=False)
                except OutputTooSmall as exc:
                    if options is not None and not options.may_run_twice:
                        raise  # it ran: not again (the full way says the same)
                    result = None  # the full way grows
                    if exc.output is not None and exc.needed is not None:
                        # It, and later requests of the plan, start on a slot that large (or on the
                        # wire, where one has no room), not on this one they outgrow.
                        quick.needs = self.pool_table.outgrown(
                            info, {name: array.shape for name, array in arrays.items()}, exc.output, exc.needed)
                        quick.pool = None
                if isinstance(result, RegionNotRegistered):
                    result = None  # the full way registers again; the server ran nothing
                if result is not None:
                    if lease.extent.closed:  # close() gave up waiting for us and let go of it
                        raise ClientClosed(f"the client was closed while this request on model "
                                           f"{info.name!r} ran: its results are lost")
                    shapes = _results.answered_shapes(info, result, quick.plan.names, message)
                    for (name, spec, view), shape in zip(slot.outputs, shapes):
                        size = math.prod(shape) * spec.dtype.itemsize
                        outputs[name] = view[:size].view(spec.dtype).reshape(shape).copy()
            except ServerError as exc:
                if not _stale(exc):
                    raise
                changed = exc  # (the model changed: run again below, once the slot is back)
            finally:
                del lease
                self._end_claim(claim)
        if changed is not None:
            self.forget_model(info.name)
            try:
                return (yield from self._quick_again(quick, arrays, options)(info, changed))
            finally:
                changed = None  # (see _steps.advance)
        if result is None:  # refused before it ran, or outgrown: the full way heals and runs it
            return (yield from self._quick_the_full_way(quick, arrays, options))
        if self.disposals.maybe_due:
            yield from self.engine.settle_steps()
        return outputs

    def _quick_the_full_way(self, quick: QuickPlan, arrays: Mapping[str, Any],
                            options: RequestOptions | None) -> Steps:
        """A quick request that is not the common case, the full way (:meth:`chunk_steps`)."""
        steps = self.chunk_steps(quick.plan._replace(chunks=[dict(arrays)], options=options), arrays)
        return self._changed_steps(steps, quick.plan.info, self._quick_again(quick, arrays, options))

    def _quick_again(self, quick: QuickPlan, arrays: Mapping[str, Any],
                     options: RequestOptions | None) -> Callable[..., Steps]:
        """How a quick request runs again on a model that changed (:meth:`_infer_again_steps`)."""
        info = quick.plan.info
        return functools.partial(self._infer_again_steps, info.name, info.version, arrays, quick.outputs, True,
                                 "auto", None, options, None)

    def _quick_slot(self, info: ModelInfo, lease: Lease, arrays: Mapping[str, Any],
                    names: Sequence[str]) -> "_QuickSlot":
        """The slot's views and request for these inputs' shapes and outputs (made once per slot)."""
        cache = lease.extent.requests.get(lease.index)
        if cache is None:
            cache = lease.extent.requests[lease.index] = {}
        given = tuple((name, array.shape) for name, array in arrays.items())
        key = ("quick", given, *names)
        slot = cache.get(key)
        if slot is None:
            _messages.make_room(cache)
            shapes = dict(given)
            memory, capacities = lease.extent.memory, lease.pool.layout.capacities
            slot = cache[key] = _QuickSlot(
                [(spec.name, memory.array_at(lease.offset(spec.name), spec.dtype, shapes[spec.name]))
                 for spec in info.inputs],
                [(name, info.output(name), memory.array_at(lease.offset(name), np.dtype(np.uint8),
                                                           (capacities[name],)))
                 for name in names],
                _messages.own_request(self.wire, info, lease, shapes, names))
        return slot

    def stream_steps(self, plan: Plan) -> Steps:
        """One request on the client's inference stream: :class:`Emit` of each response's
        outputs, in order, until the server's final response.

        Inputs travel in a slot, held until the server is done with the
        request -- its final response, or the stream's end -- whether or not
        the caller reads every response (a caller that stops early leaves the
        rest to be dropped, and the slot comes back at the end).  Outputs
        travel in the responses, never in the slot: Triton writes every
        response of one request into the same output region and waits for
        no reader, so a later response would overwrite one not yet read.
        A server that forgot our regions (it restarted) gets them again and
        the request once more, if it had not answered yet.
        """
        try:
            return (yield from self._stream_attempts(plan))
        except ServerError as exc:
            if _stale(exc):  # the model changed: the next call reads it again
                self.forget_model(plan.info.name)  # (responses may have been handed out: no second run)
            raise

    def _stream_attempts(self, plan: Plan) -> Steps:
        info, names, route = plan.info, plan.names, plan.route
        (arrays,) = plan.chunks
        wait = None if plan.options is None else plan.options.client_timeout
        for attempt in range(2):
            entry, pool = yield from self._stream_send_steps(plan, arrays)
            answered = False
            while True:
                response = yield NextResponse(entry, wait)
                if response.error is not None:
                    if isinstance(response.error, RegionNotRegistered) and pool is not None \
                            and not answered and attempt == 0:
                        try:
                            yield from self._register_again_steps(pool)
                        except SharedMemoryRefused as exc:  # (restarted as a server that cannot open it)
                            if not self._heal_refused(pool, exc, strict=False):
                                raise
                        break
                    try:
                        raise response.error
                    finally:
                        response = None  # (see _steps.advance: the frame must not hold its failure)
                if response.result is not None:
                    answered = True
                    yield Emit(_results.wire_results(info, response.result, names, route.results))
                if response.final:
                    return
        raise AssertionError("unreachable: the second attempt returns or raises")

    def stream_send_steps(self, plan: Plan, stream: Any, requested: list | None) -> Steps:
        """Send *plan*'s one request on *stream*, a stream of the caller's (tritonshm.grpc's
        facade, which hands each response to its user's callback), its inputs in a slot (or
        lent) as :meth:`stream_steps` sends them, its outputs asked for as *requested* says
        (tritonclient's request objects, sent as they are; None: every output): outcome its
        :class:`~._stream.Streamed` entry.  The slot comes back when the server is done
        with the request, as for :meth:`stream_steps`."""
        entry, _ = yield from self._stream_send_steps(plan, plan.chunks[0], stream, requested)
        return entry

    def _stream_send_steps(self, plan: Plan, arrays: Mapping[str, Any], stream: Any = None,
                           requested: Any = _NAMES) -> Steps:
        """Lease a slot, fill it and send the request on the stream (the client's own, or
        *stream*): ``(entry, pool)`` (pool None on the wire).  Its :class:`~._claim.Claim`
        (slot, lent inputs) ends when the server is done with the request: its final
        response -- or, the stream ended first, once the server lets go of what it may
        still read.  The outputs asked for are the plan's names, or *requested* as it is."""
        info = plan.info
        shapes = {name: array.shape for name, array in arrays.items()}
        bytes_sizes = _intake.bytes_sizes(info, arrays)
        claim = Claim(self.claims, self.lent_table)
        with self._flight:
            try:
                tensors = _callers_tensors(arrays, plan.out)
                waiting = self._enter_claims(plan, tensors, claim)
                if waiting is not None:
                    yield from waiting
                lending = plan.route.lent and not self.fallback.wire
                registering = self._lend(tensors, claim) if lending else None
                if registering is not None:
                    yield from registering
                needs = {name: size for name, size in self.pool_table.needs(info, shapes, bytes_sizes).items()
                         if name not in claim.inputs}  # lent inputs take no room in a slot
                lease = None if self.fallback.wire or not needs else (
                    yield from self.pool_table.lease_steps(info, needs, plan.slot_timeout, False, plan.route.memory))
                claim.lease = lease
                # On the wire: a server that opens none of our memory, or no room for the slot (lent
                # inputs then travel in the message too); no lease and nothing else to carry: all lent.
                if self.fallback.wire or lease is None and (needs or not claim.tensors):
                    self._count_wire_copies(arrays, None, claim if lending else None)
                    inputs = _messages.wire_request(self.wire, info, arrays, [])[0]
                else:
                    yield from self._fill_steps(info, lease, arrays, bytes_sizes, plan.route.device, claim)
                    inputs = _messages.slot_request(self.wire, info, lease, shapes, (), bytes_sizes, lent=claim)[0]
                outputs = ([self.wire.requested_output(name) for name in plan.names] if requested is _NAMES
                           else requested)
                # (the driver marks the claim unanswered as it sends, until the final response)
                entry = yield StreamSend(info.name, info.version, inputs, outputs, plan.options, claim, stream)
            except GeneratorExit:  # whether the request went out is unknown: the claim waits for the server
                self._end_claim(claim)
                raise
            except BaseException:
                claim.unanswered = False  # not sent: the stream refused it
                self._end_claim(claim)
                raise
        if claim.tensors:
            self.lent_table.count(len(claim.inputs))
        pool = None if claim.lease is None else claim.lease.pool
        entry.when_final(functools.partial(self._stream_request_done, claim))
        return entry, pool

    def _stream_request_done(self, claim: Claim, answered: bool) -> None:
        """A streamed request's final response came (*answered*), or its stream ended first
        (the server may still run it): its claim ends."""
        claim.unanswered = not answered
        self._end_claim(claim)

    def _heal_refused(self, pool: SlotPool, refusal: SharedMemoryRefused, strict: bool) -> bool:
        """The server refused *pool*'s memory as a request registered it again: it restarted as
        one that cannot open our memory (a container restarted without ``--ipc=host``, client
        shared memory turned off).  The client steps down as at a first registration
        (:meth:`~._fallback.Fallback.refused`: one warning, for the client's life; *strict*: the
        caller insists on slots) and the pool leaves service -- every request would be refused
        on it, healing it again, for ever.  True where the request may go on the wire now."""
        step = self.pool_table.refused(not pool.in_dev_shm, refusal, strict)  # (else CUDA slots)
        if step is Next.RAISE:
            return False
        self.pool_table.retire(pool)
        return step is Next.WIRE

    def _register_again_steps(self, pool: SlotPool | None) -> Steps:
        """Register every extent of *pool*, and every lent allocation, again under its name
        (the server restarted and forgot them all: what was held for it may be asked about)."""
        self.disposals.server_restarted()
        lent = self.lent_table.healing()  # (held meanwhile: never let go of under its registration)
        try:
            yield from register_again_steps(pool.extents if pool is not None else [])
            try:
                yield from register_again_steps(lent)
            except SharedMemoryRefused as exc:  # (restarted as a server that cannot open the caller's memory)
                self.fallback.lending_refused_because(str(exc))  # copied from now on, as at a first refusal
                raise
        finally:
            self.lent_table.healed(lent)

    def slot_steps(self, info: ModelInfo, lease: Lease | None, shapes: Mapping[str, tuple[int, ...]],
                   names: Sequence[str], copy: bool, bytes_sizes: Mapping[str, int],
                   results: Placement, rows: _results.Rows | None = None, stream: Any = None,
                   ready: Any = None, options: RequestOptions | None = None, claim: Claim | None = None,
                   out: Mapping[str, OutTensor] | None = None) -> Steps:
        """Steps of running the inputs already in a slot (after the event *ready*, when given);
        outputs (checked *names*) land there too, and are delivered where *results* says,
        copied on *stream* (this thread's copy stream of the slot's or the results' GPU) and
        landed before they are returned.  Tensors the *claim* lends are named where they are
        instead of in the slot (no lease: all of them); results the caller allocated (*out*)
        are returned, filled.  The claim knows whether the server answered.  The caller counts
        the request in flight (:meth:`run_steps`)."""
        if ready is not None:
            yield WaitForDevice(ready)
        lent = claim if claim is not None and claim.tensors else None  # (none: the slot's kept message)
        inputs, requested, message = _messages.slot_request(self.wire, info, lease, shapes, names, bytes_sizes,
                                                            prepare=options is None, lent=lent,
                                                            kept=self._lent_messages)
        send = Send(info.name, info.version, inputs, requested, options, message, claim)
        result = yield from self._send_claimed(send, claim, None if lease is None else lease.pool)
        if lease is not None and lease.extent.closed:  # close() gave up waiting for us and let go of it
            raise ClientClosed(f"the client was closed while this request on model {info.name!r} "
                               f"ran: its results are lost")
        # Results that need no copy -- all lent (no lease), or views of the slot where they are
        # wanted -- need no stream, nor the caller's to order on: neither is looked up.
        copies = lease is not None and (copy or out is not None or rows is not None or info.has_bytes
                                        or lease.extent.memory.device != results.device)
        if stream is None and copies and lease is not None:  # (copies: there is a lease)
            stream = self._copy_stream(lease.extent.memory, results.device)
        try:
            outputs, queued, pending = _results.collect(info, lease, result, names, copy, results, rows, stream,
                                                         claim, out, self.lent_table.results,
                                                         _devices.results_stream(results, claim, out) if copies
                                                         else None, message)
            if queued:
                yield WaitForDevice(_devices.ordering_event(stream.device).record(stream))
            elif pending is not None:
                if claim is not None and claim.owns_lease and lease is not None and lease.handle is None:
                    claim.after = pending  # the slot comes back once the copies out of it are done
                else:  # it comes back another way (its handle's death: copy=False): not before them
                    if pending.event is not None:
                        yield WaitForDevice(pending.event)
                    pending.completed()
        except BaseException:
            # The slot goes back, and results already made are dropped (a caching allocator
            # hands their blocks out again at once): no copy out of the one into the other
            # may still be queued.
            if stream is not None:
                stream.synchronize()
            raise
        return outputs

    def _send_claimed(self, send: Send, claim: Claim | None, pool: SlotPool | None = None,
                      heal: bool = True) -> Steps:
        """Send *send*; its result, with *claim* unanswered from the driver's sending (it marks it)
        until the server's answer (a result, or an error the server sent; not a timeout, a
        cancellation or a lost connection, after which it may still run the request: see
        :mod:`._claim`).  A server that forgot our regions (it restarted) refused the request before
        running it: it gets them again -- every extent of *pool*, every lent allocation -- and the
        request once more; without *heal*, the :class:`RegionNotRegistered` is returned instead."""
        for attempt in range(2):
            try:
                result = yield send
            except RegionNotRegistered as exc:
                if claim is not None:
                    claim.unanswered = False  # refused before it ran
                if attempt:
                    raise
                if not heal:
                    return exc
            except BaseException as exc:
                if claim is not None:
                    claim.ended_by(exc)  # the server's own answer, or it never arrived: done with it
                raise
            else:
                if claim is not None:
                    claim.unanswered = False
                return result
            yield from self._register_again_steps(pool)
        raise AssertionError("unreachable: the second attempt returns or raises")

    @staticmethod
    def _copy_stream(memory: SlotMemory, device: int | None) -> Any:
        """This thread's copy stream of the GPU of *memory*, else of *device*; None: no GPU."""
        device = memory.device if memory.device is not None else device
        return None if device is None else _devices.copy_stream(device)

    def slot_request(self, info: ModelInfo, lease: Lease, shapes: Mapping[str, tuple[int, ...]],
                     names: Sequence[str], options: RequestOptions | None) -> tuple[list, list, Any]:
        """The request objects of a zero-copy request's slot, and its message made ready where
        there are no *options* (see :func:`._messages.slot_request`)."""
        return _messages.slot_request(self.wire, info, lease, shapes, names, {}, prepare=options is None)

    def run_steps(self, info: ModelInfo, lease: Lease, shapes: Mapping[str, tuple[int, ...]], names: Sequence[str],
                  ready: Any, options: RequestOptions | None, sent: tuple[list, list, Any] | None = None) -> Steps:
        """A zero-copy request's run (:class:`~._request.SlotRequest`), as straight-line code: once
        the event *ready* is reached, its slot's request is sent (*sent*: its objects and message,
        where the caller keeps them; else :meth:`slot_request`'s) and the outputs come back as views
        of the slot, the request counted in flight.  Its :class:`~._claim.Claim` holds the slot for
        the server if the outcome is unknown (the request keeps its lease); a run after such a one
        first waits, up to the client's slot_timeout, for the server to let go of the slot."""
        with self._flight:
            if lease.for_server:
                yield from self._await_server(info, lease)
            claim = Claim(self.claims, self.lent_table)
            claim.lease, claim.owns_lease = lease, False
            try:
                if ready is not None:
                    yield WaitForDevice(ready)
                inputs, requested, message = sent or self.slot_request(info, lease, shapes, names, options)
                send = Send(info.name, info.version, inputs, requested, options, message, claim)
                result = yield from self._send_claimed(send, claim, lease.pool)
                if lease.extent.closed:  # close() gave up waiting for us and let go of it
                    raise ClientClosed(f"the client was closed while this request on model {info.name!r} "
                                       f"ran: its results are lost")
                # (views of the slot, BYTES decoded out of it: nothing queued on a GPU)
                return _results.collect(info, lease, result, names, False, Placement(lease.extent.memory.device),
                                        ready=message)[0]
            except ServerError as exc:
                if _stale(exc):  # the model changed: the next request() reads it again
                    self.forget_model(info.name)  # (its views are of the old model's tensors: no second run)
                raise
            finally:
                self._end_claim(claim)

    def _await_server(self, info: ModelInfo, lease: Lease) -> Steps:
        """Wait until the server let go of *lease*'s slot, held for it since a run of unknown
        outcome (asking it, as waiting leases do), then count the lease running again."""
        timeout = self.planner.slot_timeout
        extent = lease.extent

        def let_go() -> bool:
            if extent.closed:
                self.engine.check_open()
                raise ClientClosed("this request's slot was let go of")
            return lease.index not in extent.for_server

        def timed_out() -> TensorInUse:
            return TensorInUse(
                f"this request on model {info.name!r} was given up on in its last run (client_timeout, "
                f"cancelled, a lost connection), and the server may still write its slot; waited "
                f"slot_timeout={timeout} s for the server to let go of it. Run it again later, or close it "
                f"and make another")

        yield from self._wait_until(let_go, timeout, timed_out)
        lease.pool.resume(lease)

    def _wait_until(self, done: Callable[[], bool], timeout: float | None,
                    timed_out: Callable[[], BaseException]) -> Steps:
        """Wait, up to *timeout* seconds, until ``done()``: for memory that another request holds, or
        that the server may still use for one given up on -- asking the server again about what is
        held for it meanwhile; then ``timed_out()`` is raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out()
            if self.engine.has_disposals():
                yield from self.engine.dispose_steps()
            yield Pause(_CLASH_POLL)

    def lease_now(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]], kind: SlotKind) -> Lease | None:
        """A zero-copy request's slot when one is free in the pool that fits it (the usual case,
        with no steps: nothing to drive); None: take :meth:`request_steps`."""
        return self.pool_table.lease_now(info, self.pool_table.needs(info, shapes, {}), kind, True)

    def request_steps(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]],
                      timeout: float | None, kind: SlotKind = SYSTEM) -> Steps:
        """A leased slot of *kind* for a zero-copy request (never a fallback: its views
        must be where they were asked for)."""
        # (strict: no room in /dev/shm says so, rather than falling back to a wire it cannot use)
        lease = yield from self.pool_table.lease_steps(info, self.pool_table.needs(info, shapes, {}), timeout, True,
                                                       kind, strict=True)
        if lease is None:
            raise SharedMemoryRefused("request() needs shared memory, but the server cannot open ours")
        return lease
