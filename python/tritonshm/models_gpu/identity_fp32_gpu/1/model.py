"""identity_fp32_gpu: OUTPUT0 = INPUT0, computed on the GPU with torch.

The GPU counterpart of the bundled ``identity_fp32``, for ``tritonshm bench
--gpu`` and the GPU tests: with ``KIND_GPU`` and
``FORCE_CPU_ONLY_INPUT_TENSORS=no`` the Python backend gives the model its
inputs where they are (device memory for CUDA shared memory), so this is
what a model on the GPU costs, without the host round trip that Triton adds
for a CPU model.

The output is a fresh device tensor, ``clone()`` of the input on the
model's GPU (one device-to-device copy, about 1 TB/s on an H100): a real
model writes its result to new memory too, and handing the input's own
memory back as the output would depend on how long the backend keeps the
request's input buffer alive.  An input that arrives in host memory (plain
gRPC) is copied to the GPU, as a GPU model would.

It needs torch (with CUDA) in the *server's* Python environment, which is
not the client's: where that environment lacks torch, add a ``.pth`` file to
its site-packages naming the site-packages directory of a torch install
(after the environment's own numpy < 2, which must win); ``bench/gpu.sh``
does so for the GPU kit.  Without torch or a GPU, ``initialize`` fails with a
message saying which, and the model does not load (the server stays up when
it is loaded explicitly, as ``tritonshm bench --gpu`` does).
"""

import json
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        try:
            import torch
            from torch.utils.dlpack import from_dlpack, to_dlpack
        except ImportError as exc:
            raise pb_utils.TritonModelException(
                f"identity_fp32_gpu needs torch in the server's Python ({sys.executable}): {exc}. "
                "Add a .pth file to that environment's site-packages naming a torch install's "
                "site-packages directory (bench/gpu.sh does this for the GPU kit)") from None
        if not torch.cuda.is_available():
            raise pb_utils.TritonModelException(
                f"identity_fp32_gpu: torch {torch.__version__} in the server's Python sees no CUDA GPU")
        self.torch = torch
        self.from_dlpack, self.to_dlpack = from_dlpack, to_dlpack
        self.device = torch.device("cuda", int(args.get("model_instance_device_id", 0)))
        config = json.loads(args["model_config"])
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = self.from_dlpack(pb_utils.get_input_tensor_by_name(request, self.input).to_dlpack())
            # One copy, wherever the input is: device to device, or host to device.
            y = x.to(self.device, copy=True)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor.from_dlpack(self.output, self.to_dlpack(y))]))
        # The backend reads the outputs from another process, outside torch's stream
        # order: they must be complete before the responses go.
        self.torch.cuda.synchronize(self.device)
        return responses
