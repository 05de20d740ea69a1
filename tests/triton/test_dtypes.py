"""The datatype table: Triton's names and numpy's dtypes, BF16 as ml_dtypes' bfloat16 (as in
tritonclient), one error for a datatype it does not know."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

import tritonshm
from tritonshm import _dtypes
from tritonshm.client._model import ModelInfo


def test_every_datatype_is_tritonclients_both_ways():
    for datatype, dtype in _dtypes.TRITON_TO_NUMPY.items():
        assert np.dtype(triton_to_np_dtype(datatype)) == dtype, datatype
        if datatype != "BYTES":
            assert np_to_triton_dtype(dtype) == datatype and _dtypes.NUMPY_TO_TRITON[dtype] == datatype
    assert _dtypes.numpy_dtype("BF16") == np.dtype(ml_dtypes.bfloat16) and _dtypes.itemsize("BF16") == 2
    assert _dtypes.itemsize("BYTES") is None and _dtypes.itemsize("FP64") == 8


def test_a_datatype_not_in_the_table_is_a_dtype_mismatch_not_a_key_error():
    with pytest.raises(tritonshm.DTypeMismatch, match="'FP8' has no numpy form here .*BF16"):
        _dtypes.numpy_dtype("FP8")


def test_a_model_with_bf16_tensors_is_described_without_error():
    info = ModelInfo.from_server(
        {"name": "m", "inputs": [{"name": "I", "datatype": "BF16", "shape": [-1, 4]}],
         "outputs": [{"name": "O", "datatype": "BF16", "shape": [-1, 4]}]}, {"max_batch_size": 8}, "")
    assert [spec.dtype for spec in info.inputs + info.outputs] == [np.dtype(ml_dtypes.bfloat16)] * 2
    assert info.inputs[0].fixed and info.inputs[0].dims == (4,)
