"""What one request is: its checked inputs and outputs, and the route of its tensors.

:class:`Routing` is the client's choice of memory for a request's slots
(host, pinned or CUDA, by the transport and the inputs' device) and of where
its results land; :class:`Route` is that choice for one request, and
:class:`Plan` the whole request, made once and passed whole through the
engine's steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

from ..errors import InvalidOption
from . import _devices
from ._devices import DeviceTensor, OutTensor, Placement
from ._model import ModelInfo
from ._options import RequestOptions
from ._slots import SYSTEM, SlotKind

__all__ = ["Plan", "Route", "Routing"]


class Route(NamedTuple):
    """Where one request's tensors go: *memory* is what its slots are made of,
    *results* where its outputs land, *device* the GPU whose copy stream
    carries its copies (None: no GPU involved), and whether its GPU tensors
    are *lent* (sent by reference where their memory can be: :mod:`._lent`)."""

    memory: SlotKind
    results: Placement
    device: int | None = None
    lent: bool = False


class Plan(NamedTuple):
    """One request, checked and routed once: what each chunk of its batch runs with."""

    info: ModelInfo
    chunks: list[dict[str, Any]]   # the checked inputs, in chunks of at most max_batch_size
    names: list[str]               # the outputs asked for
    route: Route
    copy: bool                     # results copied out (False: views of the slot)
    slot_timeout: float | None     # how long a chunk waits for a slot, in seconds
    options: RequestOptions | None = None  # what the server is told besides the tensors (None: nothing)
    out: Mapping[str, OutTensor] | None = None  # results the caller allocated, by output name


@dataclasses.dataclass(frozen=True)
class Routing:
    """How a client routes requests: its *transport*, the GPU whose CUDA slots carry host
    inputs on ``transport="cuda"`` (*default_device*), whether its host slots are
    *pinned* (then they also carry GPU inputs of models with BYTES tensors), and whether
    GPU tensors are sent *by_reference* where their memory can be."""

    transport: str
    default_device: int
    pinned: bool
    by_reference: bool = True

    def route(self, info: ModelInfo, arrays: Mapping[str, Any], output_device: Any) -> Route:
        """Which slots a request uses and where its results land.

        GPU inputs go through CUDA slots on their device (host slots for
        models with BYTES tensors, or once the server refused our CUDA
        memory); host inputs through host slots, unless the transport is
        "cuda".  Results land where the inputs were (``output_device="auto"``)
        or where asked, allocated by the inputs' library.
        """
        source, library = None, "tritonshm"
        for array in arrays.values():
            if isinstance(array, DeviceTensor):
                if source is None:
                    source, library = array.device, array.library
                elif array.device != source:
                    raise InvalidOption(f"the inputs of one request must be on one GPU, not on "
                                        f"cuda:{source} and cuda:{array.device}")
        if output_device == "auto":
            target = source
        elif output_device == "cuda" and source is not None:
            target = source
        else:
            target = _devices.parse_device(output_device, "output_device")
        results = Placement(target, library)
        home = source if source is not None else target  # whose copy stream carries the copies
        if self.transport == "cuda":
            if info.has_bytes:
                raise InvalidOption(f"model {info.name!r} has BYTES tensors, which transport='cuda' "
                                    f"cannot carry; use transport='auto'")
            device = home if home is not None else self.default_device
            return Route(SlotKind.cuda(device), results, device, self.by_reference)
        # Lent (by_reference) on every route: GPU inputs and out= results are named where they
        # are whatever the slots are made of (a request may name regions of both kinds).
        if source is None:
            return Route(SYSTEM, results, home, self.by_reference)
        if info.has_bytes:
            return Route(SYSTEM if self.pinned else SlotKind.pinned(source), results, home, self.by_reference)
        return Route(SlotKind.cuda(source), results, home, self.by_reference)

    def request_memory(self, info: ModelInfo, device: Any) -> SlotKind:
        """The slots of a zero-copy request whose views should be on *device*."""
        if device is None:
            kind = SlotKind.cuda(self.default_device) if self.transport == "cuda" else SYSTEM
        else:
            target = _devices.parse_device(device, "device")
            if target is None and self.transport == "cuda":
                raise InvalidOption("device='cpu' asks for host slots, which transport='cuda' never uses")
            kind = SYSTEM if target is None else SlotKind.cuda(target)
        if kind != SYSTEM and info.has_bytes:
            raise InvalidOption(f"model {info.name!r} has BYTES tensors, which travel in host slots only: "
                                f"request() it without device=")
        return kind
