"""A Qwen2.5-style chat template that renders tools, tool calls and tool results (the tiny
test tokenizer's ChatML template has none), and the model directory that carries it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

QWEN_TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{{- messages[0].content + '\\n\\n' if messages[0].role == 'system' else '' }}
{{- '# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return <tool_call>{\"name\": <function-name>, \"arguments\": <args-json-object>}</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}
{{- call.function.arguments | tojson + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def write_tools_model(path: Path, tokenizer: Any) -> Path:
    """The servers' tiny model (``write_api_model``) with :data:`QWEN_TOOLS_TEMPLATE`."""
    from serving_harness import write_api_model

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    return write_api_model(path, tok)
