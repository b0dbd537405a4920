"""Recognising vLLM's context-length 400 (``failures.context_length_error``), without a server."""

from __future__ import annotations

import json

from services.reward_api.failures import PromptTooLong, context_length_error
from tests.helpers.faulty_executor import CONTEXT_400

# vLLM 0.32's other wording (vllm/renderers/params.py): the prompt failed the character pre-check.
CHARS_400 = (
    '{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, your prompt contains '
    "90000 characters (more than 81920 characters, which is the upper bound for 4096 input tokens). Please reduce "
    'the length of the input prompt.","type":"BadRequestError","param":"input_text","code":400}}'
)


def test_token_count_and_limit_are_read() -> None:
    exc = context_length_error(400, json.dumps({"error": {"message": CONTEXT_400, "code": 400}}))
    assert isinstance(exc, PromptTooLong) and (exc.tokens, exc.limit) == (3187, 2048)


def test_character_wording_gives_the_limit_without_a_count() -> None:
    exc = context_length_error(400, CHARS_400)
    assert isinstance(exc, PromptTooLong) and (exc.tokens, exc.limit) == (None, 4096)


def test_other_answers_are_not_prompt_too_long() -> None:
    assert context_length_error(400, '{"error": {"message": "temperature must be >= 0"}}') is None
    assert context_length_error(500, CONTEXT_400) is None  # a server error stays an infrastructure failure
    assert context_length_error(200, CONTEXT_400) is None
