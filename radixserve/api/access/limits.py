"""The bounds on what one HTTP request may ask for (``ServerConfig``), checked on the parsed
body before anything is tokenized or sent: each a 400 in OpenAI's shape naming its flag."""

from __future__ import annotations

from radixserve.api.errors import APIError


def num_prompts_of(prompt: object) -> int:
    """How many prompts a completions ``prompt`` or a native ``text``/``input_ids`` holds: a
    string or a flat list of ids is one, a list of strings or id lists is a batch."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return len(prompt)
    return 1


def check_sub_requests(num_prompts: int, n: int, limit: int, param: str) -> None:
    """prompts x n is how many scheduler requests one HTTP request becomes."""
    if num_prompts * n > limit:
        raise APIError(
            f"this request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} "
            f"generations; the server allows at most {limit} per request "
            "(--max-batch-sub-requests)",
            param=param,
        )


def check_stop_strings(stop: str | list[str] | None, limit: int, param: str = "stop") -> None:
    if isinstance(stop, list) and len(stop) > limit:
        raise APIError(
            f"{param} has {len(stop)} strings; the server allows at most {limit} "
            "(--max-stop-strings)",
            param=param,
        )
