"""One generic Python-backend model for tritonshm's bundled model repository.

It runs inside the Triton server's Python backend (in the server's own
environment, numpy < 2), never in the client: every ``models/*/1/model.py``
imports it by path (Triton wants a ``model.py`` per model).  What a model
computes comes from the ``op`` parameter of its ``config.pbtxt``:

- ``identity`` (the default): OUTPUTi = INPUTi for every input, any dtype,
  BYTES included;
- ``add_sub``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1;
- ``double``: OUTPUT0 = INPUT0 * 2;
- ``add_one``: OUTPUT0 = INPUT0 + 1;
- ``tile``: OUTPUT0 = INPUT0 twice over (an output larger than its input);
- ``add_sub_string`` (``simple_string``): ``add_sub`` over BYTES elements holding the decimal text
  of INT32 values, the results as text again (b"3", b"-1");
- ``identity_dlpack``: OUTPUTi = INPUTi through DLPack, never numpy -- for datatypes numpy
  lacks (BF16: the backend refuses ``as_numpy()`` on it, "Use to_dlpack() and from_dlpack()").

A ``delay_ms`` parameter makes the model sleep that long before answering
each request (a stand-in for a slow model: tests cancel requests in flight).

Outputs keep the shape of the inputs (but for ``tile``) and are cast to the dtype the config
declares, so a client always gets back exactly what the config promises.

Five ops are more than a function of the inputs (each checks at load time that its config is
the one it needs):

- ``stream`` (decoupled, ``stream_fp32``): COUNT responses to one request, response i carrying
  OUTPUT0 = INPUT0 + i and INDEX = [i], then the final flag on its own; an INPUT0 holding a NaN
  gets an error response after the first one (then the final flag); a request parameter
  ``delay_ms`` sleeps that long between responses, and a cancelled request ends early;
- ``accumulate`` (sequence batcher, ``accumulate_fp32``): OUTPUT0 = the running sum of INPUT0
  over the sequence so far, kept per correlation id (int or string); START resets it, END drops it;
- ``sequence`` (sequence batcher, ``simple_sequence``): OUTPUT = (INPUT + START) * READY, as
  Triton's example model of that name computes it (no state);
- ``repeat`` (decoupled, ``repeat_int32``): one response per element of IN, response i carrying
  OUT = [IN[i]] and IDX = [i], sent DELAY[i] * ``delay_scale`` milliseconds after the one before,
  then the final flag on its own (Triton's C++ ``repeat`` backend, WAIT aside);
- ``echo_request`` (``echo_request``): OUTPUT0 = JSON of what the Python backend shows of the
  request (its parameters, id, correlation id, flags, timeout, and the order in which this
  instance executed it), OUTPUT1 = INPUT0.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

OPS = {
    "identity": lambda *xs: xs,
    "add_sub": lambda a, b: (a + b, a - b),
    "double": lambda a: (a * 2,),
    "add_one": lambda a: (a + 1,),
    "tile": lambda a: (np.concatenate([a, a]),),
    "add_sub_string": lambda a, b: _add_sub_string(a, b),
}


def _add_sub_string(a, b):
    """``add_sub`` over BYTES tensors of the decimal text of INT32 values (``simple_string``)."""
    def ints(x):
        return np.array([int(v) for v in x.reshape(-1)], dtype=np.int32).reshape(x.shape)

    def text(x):
        return np.array([str(v).encode() for v in x.reshape(-1)], dtype=np.object_).reshape(x.shape)

    x, y = ints(a), ints(b)
    return text(x + y), text(x - y)


class TritonPythonModel:
    """Applies the configured op to each request, one request at a time."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        op = parameters.get("op", {}).get("string_value", "identity")
        if op not in OPS and op not in _SPECIAL:
            # Fail the load: a typo in a config must not become a silent identity.
            raise ValueError(f"unknown op {op!r}; expected one of {sorted([*OPS, *_SPECIAL])}")
        self.delay = float(parameters.get("delay_ms", {}).get("string_value", 0)) / 1000
        self.inputs = [i["name"] for i in config["input"]]
        if op in OPS:
            self.outputs = [
                (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]))
                for o in config["output"]
            ]
            self.op = OPS[op]
            self._execute = self._apply
        else:
            self._execute = _SPECIAL[op](self, config)

    def execute(self, requests):
        return self._execute(requests)

    def _apply(self, requests):
        responses = []
        for request in requests:
            if self.delay:
                time.sleep(self.delay)
            xs = [pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs]
            ys = self.op(*xs)
            tensors = [
                pb_utils.Tensor(name, y if dtype is np.object_ else np.ascontiguousarray(y, dtype))
                for (name, dtype), y in zip(self.outputs, ys)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses




def _identity_dlpack(model, config):
    """The ``identity_dlpack`` op: OUTPUTi = INPUTi, the same bytes and datatype, through the
    tensors' DLPack capsules (numpy has no BF16; the backend's from_dlpack keeps the dtype code)."""

    def execute(requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor.from_dlpack(name.replace("INPUT", "OUTPUT"),
                                        pb_utils.get_input_tensor_by_name(request, name).to_dlpack())
            for name in model.inputs]) for request in requests]

    return execute


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


def _request_parameters(request) -> dict:
    """The request's parameters as a dict (the backend hands them over as a JSON string)."""
    return json.loads(request.parameters() or "{}")


def _stream(model, config):
    """The ``stream`` op: a decoupled model that sends COUNT responses to each request."""
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise ValueError("op 'stream' needs model_transaction_policy { decoupled: true }")
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def execute(requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                x = _input(request, "INPUT0")
                count = int(_input(request, "COUNT").reshape(-1)[0])
                delay = float(_request_parameters(request).get("delay_ms", 0)) / 1000
                if count < 0:
                    raise ValueError(f"COUNT must be >= 0, got {count}")
                if delay < 0:
                    raise ValueError(f"delay_ms must be >= 0, got {delay * 1000:g}")
            except Exception as exc:  # a bad request: one error response, which is also the last
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=final)
                continue
            nan = bool(np.isnan(x).any())
            for i in range(count):
                if i and delay:
                    time.sleep(delay)
                if request.is_cancelled():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"cancelled after {i} of {count} responses", pb_utils.TritonError.CANCELLED)),
                        flags=final)
                    break
                if nan and i == 1:
                    sender.send(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"INPUT0 holds a NaN (error after response 0 of {count})")))
                    sender.send(flags=final)
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", (x + np.float32(i)).astype(np.float32)),
                    pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32)),
                ]))
            else:
                if nan and count < 2:  # too few responses to put the error after the first one
                    sender.send(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"INPUT0 holds a NaN (error after response 0 of {count})")))
                sender.send(flags=final)
        return None  # a decoupled model answers through the senders only

    return execute


def _accumulate(model, config):
    """The ``accumulate`` op: a running sum of INPUT0 per sequence (a sequence-batched model)."""
    if "sequence_batching" not in config:
        raise ValueError("op 'accumulate' needs a sequence_batching config")
    states = {}  # correlation id (int or str) -> the running sum of its sequence

    def execute(requests):
        responses = []
        for request in requests:
            x = _input(request, "INPUT0")
            start, end, ready = (bool(_input(request, n).reshape(-1)[0]) for n in ("START", "END", "READY"))
            if not ready:  # a slot the batcher filled with nothing: no sequence's step
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", np.zeros_like(x, dtype=np.float32))]))
                continue
            cid = request.correlation_id()
            if start:
                states[cid] = np.zeros_like(x, dtype=np.float32)
            total = states.get(cid)
            if total is None or total.shape != x.shape:
                error = (f"sequence {cid!r} has no running sum (its START was not seen)" if total is None
                         else f"sequence {cid!r}: INPUT0 shape {list(x.shape)} is not its first "
                              f"request's {list(total.shape)}")
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)))
                if end:
                    states.pop(cid, None)
                continue
            total = states[cid] = total + x.astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", total)]))
            if end:
                del states[cid]
        return responses

    return execute


def _sequence(model, config):
    """The ``sequence`` op: OUTPUT = (INPUT + START) * READY, Triton's example ``simple_sequence``."""
    if "sequence_batching" not in config:
        raise ValueError("op 'sequence' needs a sequence_batching config")

    def execute(requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", (
            (_input(request, "INPUT") + _input(request, "START")) * _input(request, "READY")).astype(np.int32))])
            for request in requests]

    return execute


def _repeat(model, config):
    """The ``repeat`` op: a decoupled model, one response per element of IN (``repeat_int32``)."""
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise ValueError("op 'repeat' needs model_transaction_policy { decoupled: true }")
    scale = float(config.get("parameters", {}).get("delay_scale", {}).get("string_value", 1))
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def execute(requests):
        for request in requests:
            sender = request.get_response_sender()
            values, delays = _input(request, "IN").reshape(-1), _input(request, "DELAY").reshape(-1)
            if values.shape != delays.shape:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"IN and DELAY must be as long, got {values.size} and {delays.size}")), flags=final)
                continue
            for i, (value, delay) in enumerate(zip(values, delays)):
                time.sleep(float(delay) * scale / 1000)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
                ]))
            sender.send(flags=final)
        return None  # a decoupled model answers through the senders only

    return execute


def _echo_request(model, config):
    """The ``echo_request`` op: what the backend shows of each request, as JSON, and INPUT0 back."""
    executed = iter(range(1 << 62))  # this instance's execution order, across all requests

    def execute(requests):
        responses = []
        for request in requests:
            params = _request_parameters(request)
            delay = params.get("delay_ms", 0)
            if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay > 0:
                time.sleep(delay / 1000)
            seen = {
                "parameters": params,
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "requested_output_names": sorted(request.requested_output_names()),
                "order": next(executed),
            }
            x = _input(request, "INPUT0")
            rows = x.shape[0] if len(x.shape) > 1 else None  # a batched model's request: [rows, n]
            text = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", text if rows is None else np.repeat(text[None], rows, axis=0)),
                pb_utils.Tensor("OUTPUT1", x.astype(np.float32)),
            ]))
        return responses

    return execute


#: The ops that are more than a function of the inputs: each makes its own ``execute`` from the
#: model and its config (and refuses a config it cannot serve).
_SPECIAL = {"stream": _stream, "accumulate": _accumulate, "echo_request": _echo_request,
            "identity_dlpack": _identity_dlpack, "sequence": _sequence, "repeat": _repeat}
