"""Every float a client can send is checked for finiteness and range before it reaches a sampler."""

from __future__ import annotations

import math

import pytest

from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(temperature=math.nan), "temperature must be a finite number"),
    (SamplingParams(temperature=math.inf), "temperature must be a finite number"),
    (SamplingParams(temperature=-math.inf), "temperature must be a finite number"),
    (SamplingParams(temperature=1e-30), "temperature must be 0 (greedy) or >= 1e-05"),
    (SamplingParams(top_p=math.nan), "top_p must be a finite number"),
    (SamplingParams(top_p=math.inf), "top_p must be a finite number"),
    (SamplingParams(temperature=True), "temperature must be a finite number"),  # type: ignore[arg-type]
    (SamplingParams(temperature="0.5"), "temperature must be a finite number"),  # type: ignore[arg-type]
])
def test_non_finite_or_overflowing_values_are_refused(params: SamplingParams, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        params.validate()


@pytest.mark.parametrize("temperature", [0.0, 1e-5, 0.7, 1, 2.0, 50.0])
def test_ordinary_temperatures_pass(temperature: float) -> None:
    SamplingParams(temperature=temperature).validate()
