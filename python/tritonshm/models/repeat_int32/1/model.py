"""The model's code is tritonshm/_bundled_model.py, shared by every bundled model.

Triton wants a ``1/model.py`` per model; this one only brings the shared
implementation in.  What the model computes is the ``op`` parameter of its
``config.pbtxt``.
"""

import os
import sys

_TRITONSHM_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, _TRITONSHM_DIR)  # the server's environment has no tritonshm: import the file

from _bundled_model import TritonPythonModel  # noqa: E402,F401
