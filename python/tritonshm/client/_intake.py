"""Tensor intake: the caller's inputs, checked against the model before anything is sent.

Also the bookkeeping around it: which outputs are wanted, how a batch
larger than ``max_batch_size`` splits into chunks, and how many bytes each
tensor needs in a slot.  (How the chunks' outputs join again:
:mod:`._results`.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from ..errors import DTypeMismatch, InvalidOption, NameMismatch, ReadOnlyRegion, ShapeMismatch
from . import _bytes, _devices
from ._devices import Placement, Span
from ._model import ModelInfo, shape_fits

__all__ = ["bytes_sizes", "check_inputs", "check_out", "output_names", "slot_needs", "split_batch"]

# A BYTES output's first guess when nothing better is known; the server
# says how much it really needs and the slot grows to that.
_BYTES_OUTPUT_GUESS = 4096


def check_inputs(info: ModelInfo, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Inputs as numpy arrays or :class:`~._devices.DeviceTensor` (GPU inputs, never
    converted), checked against the model; and the batch size (1 if unbatched)."""
    if not isinstance(inputs, Mapping):
        raise InvalidOption(f"inputs must be a mapping of input name to array, not {type(inputs).__name__}")
    expected = info.input_names
    if inputs.keys() != expected:
        missing = expected - set(inputs)
        unknown = set(inputs) - expected
        raise NameMismatch(
            f"model {info.name!r} takes inputs {sorted(expected)}; "
            + (f"missing {sorted(missing)}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"unknown {sorted(unknown)}" if unknown else "")
        )
    arrays: dict[str, Any] = {}
    batch = None
    for spec in info.inputs:
        value = inputs[spec.name]
        array: np.ndarray | _devices.DeviceTensor
        if isinstance(value, (np.ndarray, _devices.DeviceTensor)):  # DeviceTensor: captured already
            array = value
        else:
            device_tensor = _devices.as_device_tensor(value)
            array = np.asarray(value) if device_tensor is None else device_tensor
        if spec.is_bytes:
            if array.dtype.kind not in "OSU":
                raise DTypeMismatch(
                    f"input {spec.name!r} of model {info.name!r} is BYTES: give bytes/str "
                    f"(an object or bytes array), not {array.dtype}"
                )
        elif array.dtype != spec.dtype:
            raise DTypeMismatch(
                f"input {spec.name!r} of model {info.name!r} is {spec.datatype} ({spec.dtype}), "
                f"got {array.dtype}; convert it explicitly (no silent casts)"
            )
        want = info.shape_of(spec, -1)
        if not shape_fits(want, array.shape):
            raise ShapeMismatch(
                f"input {spec.name!r} of model {info.name!r} has shape {list(want)} "
                f"(-1 = any), got {list(array.shape)}"
            )
        if info.batched:
            if array.shape[0] == 0:  # Triton's answer would be a byte-size mismatch ("Expected 16, got 0")
                raise ShapeMismatch(
                    f"input {spec.name!r} of model {info.name!r} has 0 rows: a batch needs at least one "
                    f"(shape {list(array.shape)})"
                )
            if batch is not None and array.shape[0] != batch:
                raise ShapeMismatch(
                    f"inputs of model {info.name!r} disagree on the batch size: "
                    f"{spec.name!r} has {array.shape[0]}, others {batch}"
                )
            batch = array.shape[0]
        arrays[spec.name] = array
    return arrays, (batch if batch is not None else 1)


def output_names(info: ModelInfo, outputs: Sequence[str] | None) -> list[str]:
    """The outputs to ask for: all of the model's (*outputs* None or empty, as in tritonclient,
    which sends no list then), or the checked selection."""
    known = info.output_names
    if isinstance(outputs, str):
        raise InvalidOption(f"outputs must be a sequence of names, not the str {outputs!r}")
    names = [] if outputs is None else list(outputs)
    if not names:
        return list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise NameMismatch(f"model {info.name!r} has outputs {list(known)}; unknown {unknown}")
    return names


def check_out(info: ModelInfo, out: Mapping[str, _devices.OutTensor], names: Sequence[str],
              chunks: Sequence[Mapping[str, Any]], results: Placement, copy: bool) -> None:
    """Results the caller allocated (``out=``), checked before anything is sent: outputs asked
    for, of their datatype, where the results go, of the shape the model's config gives
    (variable dims: any; the server's answer is checked too), one request, copied results."""
    if len(chunks) > 1:
        raise InvalidOption(f"out= takes the results of one request, but this batch on model {info.name!r} "
                            f"splits into {len(chunks)} (max_batch_size {info.max_batch_size})")
    if not copy:
        raise InvalidOption("out= and copy=False both say where results go: give one")
    rows = len(next(iter(chunks[0].values()))) if info.batched and chunks[0] else 1
    for name, given in out.items():
        if name not in names:
            raise InvalidOption(f"out[{name!r}]: model {info.name!r} returns {list(names)} here")
        spec = info.output(name)
        if spec.is_bytes:
            raise DTypeMismatch(f"out[{name!r}]: output {name!r} is BYTES, which comes back as numpy objects")
        tensor = given.tensor
        if tensor.source.readonly:
            raise ReadOnlyRegion(f"out[{name!r}] is read-only (its producer exported it so): the server cannot "
                                 f"write output {name!r} of model {info.name!r} into it; give a writable tensor")
        if tensor.dtype != spec.dtype:
            raise DTypeMismatch(f"out[{name!r}] is {tensor.dtype}, but output {name!r} of model {info.name!r} "
                                f"is {spec.datatype} ({spec.dtype})")
        if tensor.device != results.device:
            where = "on the host" if results.device is None else f"on cuda:{results.device}"
            raise InvalidOption(f"out[{name!r}] is on cuda:{tensor.device}, but this request's results go "
                                f"{where} (see output_device)")
        want = info.shape_of(spec, rows)
        if not shape_fits(want, tensor.shape):
            raise ShapeMismatch(f"out[{name!r}] has shape {list(tensor.shape)}, but output {name!r} of model "
                                f"{info.name!r} has shape {list(want)} (-1 = any) for this request")
    spans = [(name, Span.of(given.tensor, writes=True)) for name, given in out.items()]
    for index, (name, span) in enumerate(spans):
        for other, other_span in spans[index + 1:]:
            if span.clashes(other_span):
                raise InvalidOption(f"out[{name!r}] and out[{other!r}] overlap: the server would write outputs "
                                    f"{name!r} and {other!r} of model {info.name!r} into the same memory")


def split_batch(info: ModelInfo, arrays: dict[str, np.ndarray], batch: int) -> list[dict[str, np.ndarray]]:
    """The inputs in chunks of at most ``max_batch_size`` items (one chunk if they fit)."""
    if not info.batched or batch <= info.max_batch_size:
        return [arrays]
    step = info.max_batch_size
    return [{n: a[i:i + step] for n, a in arrays.items()} for i in range(0, batch, step)]


def slot_needs(info: ModelInfo, shapes: Mapping[str, tuple[int, ...]],
               bytes_sizes: Mapping[str, int]) -> dict[str, int]:
    """Bytes each tensor needs in a slot for a request of these input shapes.

    Fixed-size inputs and outputs are sized for a full batch.  Variable
    outputs are guessed as large as the largest input (right for
    elementwise models) and grown when the server says they were too
    small; BYTES inputs need their serialized size (*bytes_sizes*).
    """
    rows = info.max_batch_size if info.batched else 1
    needs: dict[str, int] = {}
    for spec in info.inputs:
        if spec.is_bytes:
            needs[spec.name] = bytes_sizes[spec.name]
            continue
        dims = spec.dims if spec.fixed else (shapes[spec.name][1:] if info.batched else shapes[spec.name])
        needs[spec.name] = math.prod(dims) * spec.dtype.itemsize * rows
    largest = max(needs.values(), default=0)
    for spec in info.outputs:
        if spec.is_bytes:
            needs[spec.name] = max(largest, _BYTES_OUTPUT_GUESS)
        elif spec.fixed:
            needs[spec.name] = math.prod(spec.dims) * spec.dtype.itemsize * rows
        else:
            needs[spec.name] = largest
    return needs


def bytes_sizes(info: ModelInfo, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The serialized size of every BYTES input."""
    return {spec.name: _bytes.encoded_nbytes(arrays[spec.name]) for spec in info.inputs if spec.is_bytes}
