"""Each model failure carries the fixed sentence operators read in a failed job's record."""

from __future__ import annotations

import pytest

from app.kit.llm import (
    ModelBadRequest,
    ModelError,
    ModelInvalidResponse,
    ModelOutputTruncated,
    ModelRateLimited,
    ModelRefused,
    ModelTimeout,
    ModelUnavailable,
)


@pytest.mark.parametrize(
    ("error_type", "message"),
    [
        (ModelTimeout, "The language model did not answer in time."),
        (ModelUnavailable, "The language model server was unreachable or failed."),
        (ModelRateLimited, "The language model server is rate-limiting requests."),
        (ModelRefused, "The language model refused the consolidation request."),
        (ModelOutputTruncated, "The language model's answer was cut off at its output limit."),
        (
            ModelBadRequest,
            "The language model server rejected the request (key, model, options).",
        ),
        (
            ModelInvalidResponse,
            "The language model server sent a response that is not a chat completion.",
        ),
        (ModelError, "The language model call failed."),
    ],
)
def test_a_model_failure_names_itself_to_operators_without_its_details(
    error_type: type[ModelError], message: str
) -> None:
    error = error_type("HTTP 500 for model gpt-test, request id req_1")

    assert error.operator_message == message
    assert error.message not in error.operator_message
