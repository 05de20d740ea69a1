"""The zero-copy request both clients hand out: a leased slot and views of it.

:class:`SlotRequest` is the one implementation -- the lease, the input
views, the steps of a run, giving the slot back.  :class:`tritonshm.Request`
(blocking) and :class:`tritonshm.aio.Request` each *hold* one and run its
steps with their client's driver, so neither is a subclass of the other.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeVar

from ..errors import ClientClosed
from . import _devices, _intake
from ._model import ModelInfo
from ._pool import Lease
from ._steps import Steps

if TYPE_CHECKING:
    from ._run import Runner

Self = TypeVar("Self", bound="RequestFace")

__all__ = ["RequestFace", "SlotRequest"]


class SlotRequest:
    """A leased slot with views of the inputs; :meth:`run_steps` runs what they hold."""

    def __init__(self, runner: Runner, info: ModelInfo, lease: Lease, shapes: Mapping[str, tuple[int, ...]]):
        self.info = info
        self._runner = runner
        self._lease: Lease | None = lease
        self._shapes = dict(shapes)
        # The slot's request objects and message for a run of every output with no options of its
        # own, made at the first such run: the slot and shapes never change, nor does the message.
        self._usual: tuple[list, list, Any] | None = None
        memory, layout = lease.extent.memory, lease.pool.layout
        # Read-only: an input is filled in place (``inputs[name][...] = x``); one rebound instead
        # would be silently ignored -- the run sends what the slot holds.
        self.inputs: Mapping[str, Any] = MappingProxyType({
            spec.name: memory.view(lease.handle, layout.offsets[spec.name], spec.dtype, self._shapes[spec.name])
            for spec in info.inputs
        })

    def run_steps(self, outputs: Sequence[str] | None, stream: Any = None,
                  options: Mapping[str, Any] | None = None) -> Steps:
        """The steps of a run on the inputs as they are now (with the request *options* given
        by keyword); the ordering point (an event on the caller's stream, for a slot on a
        GPU) is taken here, on the calling thread, and the options checked."""
        lease, runner, info = self._lease, self._runner, self.info
        if lease is None:
            raise ClientClosed("this request is closed")
        sent = None
        names: Sequence[str]
        if outputs is None and not options and runner.planner.default_options is None:
            # The usual run, every output and no options: nothing to check, its message kept here.
            names = info.output_names
            sent = self._usual
            if sent is None:
                sent = self._usual = runner.slot_request(info, lease, self._shapes, names, None)
            checked = None
        else:
            names = _intake.output_names(info, outputs)
            checked = runner.planner.request_options(options or {})
        device = lease.extent.memory.device
        ready = None if device is None else _devices.current_stream_event(device, stream)
        return runner.run_steps(info, lease, self._shapes, names, ready, checked, sent)

    def close(self) -> None:
        """Give up the hold on the slot (views keep it until they go); idempotent."""
        lease, self._lease = self._lease, None
        if lease is not None:
            self.inputs = MappingProxyType({})
            lease.pool.finished(lease)

    def __del__(self) -> None:
        self.close()


class RequestFace:
    """What both clients' ``Request`` show of the :class:`SlotRequest` they hold: its inputs,
    its model, ``close()`` and ``with``.  Each adds ``run()`` through its own driver."""

    def __init__(self, core: SlotRequest, driver: Any):
        self._core = core
        self._driver = driver

    @property
    def inputs(self) -> Mapping[str, Any]:
        """Views of the slot's inputs, by name, to fill in place -- ``inputs[name][...] = x``
        (the mapping itself is read-only); empty once closed."""
        return self._core.inputs

    @property
    def model(self) -> ModelInfo:
        """What the client knows about the model."""
        return self._core.info

    def close(self) -> None:
        """Give up this request's hold on the slot (views keep it until they go)."""
        self._core.close()

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
