"""What :mod:`tritonshm.grpc` and :mod:`tritonshm.http` share: a tritonclient ``infer`` call
carried through a :class:`tritonshm.Client`'s slot pools, and its result answered as
tritonclient's.

A call is taken by the slots only when they can carry it exactly as tritonclient would send it:
every input given data with ``set_data_from_numpy``, the model's inputs each once with its
datatype and a shape it takes, a batch within ``max_batch_size``, outputs asked for by name only
(not bound to shared memory by hand, no classification, binary over HTTP), options the client's
:class:`~tritonshm.RequestOptions` takes, no ``request_id`` or ``query_params``.  Any other call
goes to tritonclient's own ``infer`` untouched: the same request on the wire, so the same answer
-- and for a mistake, the server's own error with its ``status()``, not one of ours.  Nothing here
changes the caller's ``InferInput`` / ``InferRequestedOutput`` objects: their bytes are read and
copied into a slot once.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from . import _tritonclient_compat as compat
from .client import RequestOptions
from .errors import InferenceServerException

__all__ = ["SlotRoute", "SlotResult", "SHM_URL_SCHEMES"]

#: The tritonshm URL scheme of each protocol, plain and over TLS.
SHM_URL_SCHEMES = {("grpc", False): "", ("grpc", True): "grpcs://",
                   ("http", False): "http://", ("http", True): "https://"}


def _parameters(tensor: Any, http: bool) -> Mapping[str, Any]:
    """The parameters of a request object's tensor (gRPC: a protobuf map; HTTP: a dict)."""
    return (tensor.get("parameters") or {}) if http else tensor.parameters


class SlotRoute:
    """The slot pools of one facade client: a :class:`tritonshm.Client` for the same server,
    made on the first call it can carry, and the conversion of tritonclient's request objects
    to its inputs and of its outputs to a tritonclient result.

    *protocol* is ``"grpc"`` or ``"http"``; *url* and *ssl* are what the facade's constructor
    took; *connect_options* its other arguments that differ from tritonclient's defaults, passed
    on to the tritonclient client the slots' client holds.  *result_type* is the facade's result
    class (see :func:`~tritonshm._tritonclient_compat.result_class`).
    """

    def __init__(self, protocol: str, url: str, ssl: bool, connect_options: Mapping[str, Any],
                 module: Any, result_type: type):
        self.http = protocol == "http"
        self.url = SHM_URL_SCHEMES[(protocol, bool(ssl))] + url
        self._connect_options = dict(connect_options)
        self._module = module
        self._result_type = result_type
        self._client: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, str], str] = {}

    @property
    def client(self) -> Any:
        """The :class:`tritonshm.Client` holding the slot pools, or None before the first call
        that used them (or after :meth:`close`)."""
        return self._client

    def _shm_client(self) -> Any:
        with self._lock:
            if self._client is None and not self._closed:
                from .client import Client

                # The slots' own connection: tritonclient's HTTP client is the caller's thread's.
                self._client = Client(self.url, connect_options=self._connect_options or None)
            return self._client

    def close(self) -> None:
        """Unregister and unlink the slots (the server's other regions are left be); idempotent.
        Later calls go to tritonclient's own ``infer``."""
        with self._lock:
            self._closed, client, self._client = True, self._client, None
        if client is not None:
            client.close()

    # -- a call ---------------------------------------------------------------

    def infer(self, facade: Any, model_name: str, inputs: Sequence[Any], model_version: str,
              outputs: Sequence[Any] | None, request_id: str, options: Mapping[str, Any]) -> Any:
        """The call carried through the slots, its result a tritonclient ``InferResult``; or None
        when they cannot carry it exactly (the caller then sends it with tritonclient's ``infer``).

        *options* are tritonclient's keyword arguments of the call other than those named here,
        only those not at their defaults.
        """
        if self._closed or request_id:
            return None
        arrays = self._arrays(inputs)
        names = self._output_names(outputs)
        if arrays is None or names is None:
            return None
        client = self._shm_client()
        if client is None:
            return None
        try:
            checked = RequestOptions.of(options)
            checked.infer_kwargs(self.http)  # an option of the other protocol: refused here
            if self.http and checked.client_timeout is not None:
                return None
            info = client.model_info(model_name, model_version)
        except InferenceServerException:
            return None  # the server or the options say no: tritonclient's call says how, its way
        if not self._fits(info, inputs, arrays, names):
            return None
        wanted = list(info.output_names) if names is _ALL else names
        outputs_made = client.infer(model_name, arrays, outputs=wanted, version=model_version, options=checked)
        version = model_version or self._version_run(facade, model_name)
        # In the response as the server orders them: the model's order, not the request's.
        specs = [spec for spec in info.outputs if spec.name in outputs_made]
        return self._result_type(model_name, version, specs, outputs_made)

    def _arrays(self, inputs: Sequence[Any]) -> dict[str, np.ndarray] | None:
        """Each input's data as an array (views of the bytes tritonclient keeps, no copy), or
        None where an input is not tritonclient's of this protocol, has no data, was bound to
        shared memory by hand, or is named twice."""
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            return None
        kind = self._module.InferInput
        arrays: dict[str, np.ndarray] = {}
        for given in inputs:
            if type(given) is not kind:  # a subclass may send what we do not read
                return None
            tensor = compat.tensor_of(given)
            if "shared_memory_region" in _parameters(tensor, self.http):
                return None  # bound by hand: sent as tritonclient sends it
            name, datatype, shape = given.name(), given.datatype(), [int(d) for d in given.shape()]
            if name in arrays:
                return None
            content = compat.input_content(given, self.http)
            array = self._array(datatype, shape, content, tensor.get("data") if self.http else None)
            if array is None:
                return None
            arrays[name] = array
        return arrays

    @staticmethod
    def _array(datatype: str, shape: list[int], content: bytes | None, data: Any) -> np.ndarray | None:
        from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

        if any(d < 0 for d in shape):
            return None
        if content is None:
            if data is None:
                return None  # no data: tritonclient sends it so, and the server says what is wrong
            if datatype == "BF16":
                return None
            array = np.array(data, dtype=np.object_ if datatype == "BYTES" else triton_to_np_dtype(datatype))
        elif datatype == "BYTES":
            array = deserialize_bytes_tensor(content) if content else np.empty(0, np.object_)
        else:
            dtype = triton_to_np_dtype(datatype)
            if dtype is None or len(content) != math.prod(shape) * np.dtype(dtype).itemsize:
                return None  # shape changed after the data was set: the server's error, not ours
            array = np.frombuffer(content, dtype=dtype)
        if array.size != math.prod(shape):
            return None
        return array.reshape(shape)

    def _output_names(self, outputs: Sequence[Any] | None) -> Any:
        """The outputs asked for by name (:data:`_ALL` for tritonclient's None), or None where
        one is not tritonclient's of this protocol, is bound to shared memory by hand, asks for
        classification, is JSON over HTTP, or is named twice."""
        if outputs is None:
            return _ALL
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            return None
        kind = self._module.InferRequestedOutput
        names: list[str] = []
        for given in outputs:
            if type(given) is not kind:
                return None
            parameters = _parameters(compat.tensor_of(given), self.http)
            if "shared_memory_region" in parameters or "classification" in parameters:
                return None
            if self.http and parameters.get("binary_data") is False:
                return None  # JSON data in the response: tritonclient's get_output shows it
            if given.name() in names:
                return None
            names.append(given.name())
        return names

    @staticmethod
    def _fits(info: Any, inputs: Sequence[Any], arrays: Mapping[str, np.ndarray], names: Any) -> bool:
        """Whether the request is one the model takes as it is: every input once, of its datatype
        and a shape it takes, a batch within max_batch_size (never split here: tritonclient's
        semantics are the server's error), outputs the model has; not decoupled."""
        if info.decoupled or set(arrays) != info.input_names:
            return False
        declared = {given.name(): given.datatype() for given in inputs}
        batch = None
        for spec in info.inputs:
            array = arrays[spec.name]
            if declared[spec.name] != spec.datatype:
                return False
            want = info.shape_of(spec, -1)
            if len(want) != array.ndim or any(w not in (-1, s) for w, s in zip(want, array.shape)):
                return False
            if info.batched:
                rows = array.shape[0]
                if batch not in (None, rows) or not 1 <= rows <= info.max_batch_size:
                    return False
                batch = rows
        return names is _ALL or all(name in info.output_names for name in names)

    def _version_run(self, facade: Any, model: str) -> str:
        """The version the server runs when none is named: the highest it serves (Triton's
        choice), read once per model from its metadata."""
        version = self._versions.get((model, ""))
        if version is None:
            metadata = facade.get_model_metadata(model)
            versions = list(metadata["versions"] if self.http else metadata.versions)
            numeric = [v for v in versions if str(v).isdigit()]
            version = max(numeric, key=int) if numeric else (versions[-1] if versions else "")
            self._versions[(model, "")] = version
        return str(version)


class _All:
    """Every output of the model (tritonclient's ``outputs=None``)."""

    def __repr__(self) -> str:
        return "<all outputs>"


_ALL: Any = _All()


class SlotResult:
    """The result of a call the slots carried: what tritonclient's ``InferResult`` answers.

    ``as_numpy(name)`` is the output's array (of tritonclient's dtype: BYTES an object array of
    bytes, BF16 ``ml_dtypes.bfloat16``; None for a name not in the result), copied out of the
    slot; ``get_output(name)`` and ``get_response()`` (tritonclient's own methods) answer from the
    response the server would have sent over the wire with the tensors in it: built on first
    use, so a caller who reads only ``as_numpy`` never pays for it.
    """

    def __init__(self, model_name: str, model_version: str, specs: Sequence[Any],
                 arrays: Mapping[str, np.ndarray]):
        self._model = model_name
        self._version = model_version
        self._specs = list(specs)
        self._arrays = dict(arrays)

    def as_numpy(self, name: str) -> np.ndarray | None:
        """The output *name* as a numpy array, as tritonclient's ``as_numpy``; None if absent."""
        return self._arrays.get(name)

    def _raw(self, spec: Any) -> bytes:
        """Output *spec*'s bytes as the server sends them (BYTES: length-prefixed)."""
        array = self._arrays[spec.name]
        if spec.is_bytes:
            from tritonclient.utils import serialize_byte_tensor

            serialized = serialize_byte_tensor(array)
            return serialized.item() if serialized.size > 0 else b""
        return np.ascontiguousarray(array).tobytes()


class GrpcSlotResult(SlotResult):
    """A :class:`SlotResult` of ``tritonclient.grpc``: its response a ``ModelInferResponse``."""

    def _make_response(self) -> Any:
        from tritonclient.grpc import service_pb2

        response = service_pb2.ModelInferResponse(model_name=self._model, model_version=self._version)
        for spec in self._specs:
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = spec.name, spec.datatype
            tensor.shape.extend(self._arrays[spec.name].shape)
            response.raw_output_contents.append(self._raw(spec))
        return response


class HttpSlotResult(SlotResult):
    """A :class:`SlotResult` of ``tritonclient.http``: its response the JSON header as a dict,
    each output's ``binary_data_size`` what its bytes would have taken after it."""

    def _make_response(self) -> Any:
        outputs = [{"name": spec.name, "datatype": spec.datatype, "shape": list(self._arrays[spec.name].shape),
                    "parameters": {"binary_data_size": len(self._raw(spec))}} for spec in self._specs]
        return {"model_name": self._model, "model_version": self._version, "outputs": outputs}


def constructor_arguments(signature: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, bool, dict]:
    """``(url, ssl, connect options)`` of a call of tritonclient's constructor with *signature*
    (``self`` first): the options are the arguments other than ``url``, ``verbose`` and ``ssl``
    given at a value other than their default, for the slots' own tritonclient client."""
    bound = signature.bind(None, *args, **kwargs)
    given = dict(bound.arguments)
    given.pop("self", None)
    options = {name: value for name, value in given.items() if name not in ("url", "verbose", "ssl")
               and value is not signature.parameters[name].default}
    return str(given["url"]), bool(given.get("ssl", False)), options


def reexport(module: Any, namespace: dict[str, Any]) -> list[str]:
    """Put every public name of tritonclient's *module* into *namespace* (a facade module's
    globals), unchanged; its ``__all__``."""
    for name in dir(module):
        if not name.startswith("_"):
            namespace[name] = getattr(module, name)
    return list(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))
