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
- ``tile``: OUTPUT0 = INPUT0 twice over (an output larger than its input).

A ``delay_ms`` parameter makes the model sleep that long before answering
each request (a stand-in for a slow model: tests cancel requests in flight).

Outputs keep the shape of the inputs (but for ``tile``) and are cast to the dtype the config
declares, so a client always gets back exactly what the config promises.
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
}


class TritonPythonModel:
    """Applies the configured op to each request, one request at a time."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        op = config.get("parameters", {}).get("op", {}).get("string_value", "identity")
        if op not in OPS:
            # Fail the load: a typo in a config must not become a silent identity.
            raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")
        self.op = OPS[op]
        self.delay = float(config.get("parameters", {}).get("delay_ms", {}).get("string_value", 0)) / 1000
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]))
            for o in config["output"]
        ]

    def execute(self, requests):
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
