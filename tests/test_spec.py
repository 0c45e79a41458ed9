"""The experience spec: inference, validation, casting, growth."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit import ExperienceSpec, FieldSpec, SpecError


def test_infer_records_trailing_shapes_dtypes_and_bytes():
    spec = ExperienceSpec.infer({"obs": torch.zeros(5, 3, 2), "a": np.zeros(5, dtype=np.int64)})
    assert spec["obs"] == FieldSpec("obs", (3, 2), torch.float32)
    assert spec["a"] == FieldSpec("a", (), torch.int64)
    assert spec.bytes_per_sample == 3 * 2 * 4 + 8


def test_declared_spec_and_json_round_trip():
    spec = ExperienceSpec.of(obs=((4,), "float32"), action=((), torch.int64), done=((), "bool"))
    assert ExperienceSpec.from_json(spec.to_json()) == spec
    assert "obs: float32[4]" in spec.describe()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"obs": torch.zeros(2, 4)}, "missing ['action']"),
        ({"obs": torch.zeros(2, 4), "action": torch.zeros(2, dtype=torch.int64), "x": torch.zeros(2)}, "unexpected ['x']"),
        ({"obs": torch.zeros(2, 5), "action": torch.zeros(2, dtype=torch.int64)}, "field 'obs': expected trailing shape (4,), received (5,)"),
        ({"obs": torch.zeros(2, 4), "action": torch.zeros(2)}, "field 'action': expected dtype int64, received float32"),
        ({"obs": torch.zeros(2, 4), "action": torch.zeros(3, dtype=torch.int64)}, "disagree on the leading"),
        ({"obs": torch.zeros(0, 4), "action": torch.zeros(0, dtype=torch.int64)}, "empty write"),
        ({"obs": "nope", "action": torch.zeros(2, dtype=torch.int64)}, "field 'obs': expected a torch.Tensor"),
        ({"obs": torch.tensor(1.0), "action": torch.zeros(2, dtype=torch.int64)}, "scalar"),
    ],
)
def test_validation_errors_name_field_expected_and_received(data, fragment):
    spec = ExperienceSpec.of(obs=((4,), "float32"), action=((), "int64"))
    with pytest.raises(SpecError) as e:
        spec.validate(data)
    assert fragment in str(e.value)


def test_safe_casts_are_applied_and_input_is_not_mutated():
    spec = ExperienceSpec.of(obs=((2,), "float32"), action=((), "int64"))
    obs = np.ones((3, 2), dtype=np.float64)
    act = torch.ones(3, dtype=torch.int32)
    out = spec.validate({"obs": obs, "action": act})
    assert out["obs"].dtype == torch.float32 and out["action"].dtype == torch.int64
    assert obs.dtype == np.float64 and act.dtype == torch.int32


def test_numpy_is_converted_without_copy():
    spec = ExperienceSpec.of(obs=((2,), "float32"))
    arr = np.zeros((3, 2), dtype=np.float32)
    out = spec.validate({"obs": arr})
    arr[0, 0] = 7.0
    assert out["obs"][0, 0] == 7.0


def test_numpy_arrays_of_any_layout_are_accepted_and_their_values_kept():
    """Writeable arrays take the fast path without a copy; reversed or read-only ones the general path."""
    spec = ExperienceSpec.of(obs=((2,), "float32"), action=((), "int64"))
    obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    act = np.array([4, 5, 6], dtype=np.int64)
    fast = spec.validate({"obs": obs, "action": act})
    assert fast["obs"].data_ptr() == obs.ctypes.data and fast["action"].tolist() == [4, 5, 6]
    reversed_ = spec.validate({"obs": obs[::-1], "action": act[::-1]})
    assert reversed_["obs"].tolist() == [[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]] and reversed_["action"].tolist() == [6, 5, 4]
    frozen = act.copy()
    frozen.flags.writeable = False
    assert spec.validate({"obs": obs, "action": frozen})["action"].tolist() == [4, 5, 6]
    with pytest.raises(SpecError, match="action"):
        spec.validate({"obs": obs, "action": act.reshape(3, 1)})


def test_growable_field_accepts_larger_trailing_shape_and_reports_growth():
    spec = ExperienceSpec.of(obs=FieldSpec("obs", (4,), torch.float32, growable=True))
    big = {"obs": torch.zeros(2, 6)}
    spec.validate(big)
    grown = spec.grown_by(big)
    assert grown is not None and grown["obs"].shape == (6,)
    assert spec.grown_by({"obs": torch.zeros(2, 3)}) is None
    with pytest.raises(SpecError):
        spec.validate({"obs": torch.zeros(2, 4, 1)})  # rank may not change


def test_field_spec_rejects_bad_names_and_shapes():
    with pytest.raises(SpecError):
        FieldSpec("", (1,), torch.float32)
    with pytest.raises(SpecError):
        FieldSpec("x", (-1,), torch.float32)
    with pytest.raises(SpecError):
        ExperienceSpec({})
