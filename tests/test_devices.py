import pytest
import torch

from quarl.devices import resolve_device, resolve_dtype


def test_auto_and_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16


def test_errors_name_the_key_and_the_fix():
    class StageError(ValueError):
        pass

    with pytest.raises(StageError, match="train.device='tpu7' is not a device name"):
        resolve_device("tpu7", key="train.device", error=StageError)
    with pytest.raises(ValueError, match="dtype='int3' is not a dtype; use one of"):
        resolve_dtype("int3", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available; use device=cpu or auto"):
            resolve_device("cuda")
