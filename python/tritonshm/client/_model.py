"""Model discovery: what a model takes and returns, read from the server.

The client never asks callers to declare shapes or datatypes: it reads each
model's metadata and config once and keeps them as a :class:`ModelInfo`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import _dtypes

__all__ = ["TensorSpec", "ModelInfo", "shape_fits"]


def shape_fits(want: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether *shape* matches the model's *want*, where -1 matches any size."""
    return len(shape) == len(want) and all(w == -1 or w == s for w, s in zip(want, shape))


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, as the server describes it."""

    name: str                   #: the tensor's name in the model
    datatype: str               #: Triton datatype, e.g. "FP32"
    dims: tuple[int, ...]       #: per-item dims, without the batch dim; -1 = variable

    @functools.cached_property
    def dtype(self) -> np.dtype:
        """The numpy dtype (object for BYTES)."""
        return _dtypes.numpy_dtype(self.datatype)

    @functools.cached_property  # (read on every request: a plain attribute after the first)
    def is_bytes(self) -> bool:
        """True for BYTES (variable-length strings) tensors."""
        return self.datatype == "BYTES"

    @functools.cached_property
    def fixed_dims(self) -> tuple[tuple[int, int], ...]:
        """``(index, size)`` of each dim that is not variable (what an answer's shape must have)."""
        return tuple((index, size) for index, size in enumerate(self.dims) if size != -1)

    @functools.cached_property
    def fixed(self) -> bool:
        """True when no dim is variable and the datatype has a fixed size."""
        return -1 not in self.dims and not self.is_bytes


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the client knows about a model: read from the server, never declared."""

    name: str                   #: the model's name
    version: str                #: the model version asked for ("" for the server's choice)
    inputs: tuple[TensorSpec, ...]   #: the model's inputs, in the server's order
    outputs: tuple[TensorSpec, ...]  #: the model's outputs, in the server's order
    max_batch_size: int         #: 0 when the model does not batch
    decoupled: bool = False     #: answers a request with any number of responses (streams only)
    #: the versions the server said it serves when the client read the model (its metadata)
    versions: tuple[str, ...] = ()

    @functools.cached_property  # (read on every request: a plain attribute after the first)
    def batched(self) -> bool:
        """True when inputs carry a leading batch dim."""
        return self.max_batch_size > 0

    @functools.cached_property
    def input_names(self) -> frozenset[str]:
        """The names of the inputs."""
        return frozenset(spec.name for spec in self.inputs)

    @functools.cached_property
    def output_names(self) -> tuple[str, ...]:
        """The names of the outputs, in the model's order."""
        return tuple(spec.name for spec in self.outputs)

    @functools.cached_property
    def has_bytes(self) -> bool:
        """True when any input or output is BYTES (those travel in host slots only)."""
        return any(spec.is_bytes for spec in self.inputs + self.outputs)

    @functools.cached_property
    def _outputs_by_name(self) -> dict[str, TensorSpec]:
        return {spec.name: spec for spec in self.outputs}

    def output(self, name: str) -> TensorSpec:
        """The output called *name*."""
        return self._outputs_by_name[name]

    def shape_of(self, spec: TensorSpec, batch: int) -> tuple[int, ...]:
        """The full tensor shape for a batch of *batch* items (dims may hold -1)."""
        return (batch, *spec.dims) if self.batched else spec.dims

    @classmethod
    def from_server(cls, metadata: Mapping[str, Any], config: Mapping[str, Any],
                    version: str) -> "ModelInfo":
        """Build from the JSON forms of model metadata and model config."""
        max_batch = int(config.get("max_batch_size", 0) or 0)

        def specs(entries: Iterable[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
            out = []
            for entry in entries:
                shape = tuple(int(d) for d in entry.get("shape", ()))
                dims = shape[1:] if max_batch > 0 else shape
                out.append(TensorSpec(entry["name"], entry["datatype"], dims))
            return tuple(out)

        policy = config.get("model_transaction_policy") or {}
        return cls(metadata["name"], version, specs(metadata.get("inputs", ())),
                   specs(metadata.get("outputs", ())), max_batch, bool(policy.get("decoupled", False)),
                   tuple(str(v) for v in metadata.get("versions", ())))
