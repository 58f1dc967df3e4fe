"""An agent's trace against a running server, through the chat route and the Responses API:
how much of each turn's prompt the radix cache serves, beside the most it could.

    .venv/bin/python benchmarks/agent_trace.py --url http://127.0.0.1:30000 --agents 4 --turns 6

Each agent has a system prompt of its own and a task; every turn the model must call a tool
(``tool_choice: required``), the trace answers the call with a tool result of ``--result-words``
words, and the next turn goes on from there:

- ``chat``: each turn re-sends the whole conversation (the system prompt, every call and every
  result so far) to ``/v1/chat/completions``, as an agent loop does;
- ``responses``: each turn sends only the new tool result to ``/v1/responses`` with
  ``previous_response_id``; the server re-renders the stored conversation;
- ``conversation``: the same with ``conversation`` (``/v1/conversations``), which the server
  adds each turn's items to (the Agents SDK's ``Runner.run(conversation_id=...)``);
- ``items``: each turn re-sends every item so far to ``/v1/responses`` (``store: false``), the
  output items as the server returned them (the Agents SDK's own session memory);
- ``messages``: each turn re-sends the whole conversation to Anthropic's ``/v1/messages``, the
  calls as ``tool_use`` blocks and their results as ``tool_result`` blocks, a tool forced with
  ``tool_choice: any`` (Claude Code's loop, which sends the whole conversation each turn);
- ``thread``: the same through an Anthropic thread (``thread``), each turn sending only the new
  tool results; the server renders the held conversation before them.

Either way a turn's prompt is the previous turn's prompt and answer plus the new result, so the
most the cache can serve is everything but the new result (and the first turn, cold): the
``optimal`` column. ``hit rate`` is cached prompt tokens over prompt tokens as the server
reports them (``cached_tokens``). Every route renders the same conversation, so their rates
should agree, and all sit near the optimum.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

TASK = "Find the weather of every city you know."
WORDS = "sunny rain cloudy wind north south pressure humidity front storm calm mild".split()
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@dataclass
class Tally:
    prompt: int = 0
    cached: int = 0
    optimal: int = 0

    def add(self, prompt: int, cached: int, optimal: int) -> None:
        self.prompt, self.cached, self.optimal = (
            self.prompt + prompt,
            self.cached + cached,
            self.optimal + optimal,
        )

    def rates(self) -> tuple[float, float]:
        return self.cached / max(self.prompt, 1), self.optimal / max(self.prompt, 1)


def result_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat_agent(client: httpx.Client, model: str, args: argparse.Namespace, tally: Tally) -> None:
    rng = random.Random(args.seed)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."},
        {"role": "user", "content": TASK},
    ]
    seen = 0  # the tokens the previous turn's prompt and answer came to
    for turn in range(args.turns):
        body = {"model": model, "messages": messages, "tools": tools, "tool_choice": "required"}
        reply = _post(client, "/v1/chat/completions", {**body, "max_tokens": args.max_tokens})
        usage = reply["usage"]
        prompt = usage["prompt_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        tally.add(prompt, cached, min(seen, prompt) if turn else 0)
        seen = prompt + usage["completion_tokens"]
        message = reply["choices"][0]["message"]
        text = result_text(rng, args.result_words)
        if not message.get("tool_calls"):  # cut by --max-tokens: the answer is plain text
            messages.append({"role": "assistant", "content": message["content"] or ""})
            messages.append({"role": "user", "content": text})
            continue
        call = message["tool_calls"][0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})


def responses_agent(
    client: httpx.Client, model: str, args: argparse.Namespace, tally: Tally
) -> None:
    """Each turn's new item after ``previous_response_id``."""

    def chain(reply: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        return {"previous_response_id": reply["id"], "input": [item]}

    _responses_trace(client, model, args, tally, {}, chain)


def conversation_agent(
    client: httpx.Client, model: str, args: argparse.Namespace, tally: Tally
) -> None:
    """Each turn's new item in a conversation, which keeps the rest."""
    conversation = {"conversation": _post(client, "/v1/conversations", {})["id"]}
    _responses_trace(client, model, args, tally, conversation, lambda _, item: {"input": [item]})


def items_agent(client: httpx.Client, model: str, args: argparse.Namespace, tally: Tally) -> None:
    """Every item so far, each turn, the outputs as they came back; nothing stored."""
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]

    def resend(reply: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        history.extend([*reply["output"], item])
        return {"input": list(history)}

    _responses_trace(client, model, args, tally, {"store": False, "input": history}, resend)


def messages_agent(
    client: httpx.Client,
    model: str,
    args: argparse.Namespace,
    tally: Tally,
    threaded: bool = False,
) -> None:
    """The whole conversation each turn, through Anthropic's Messages API; ``threaded``: in a
    thread the server holds, each turn sending its new messages alone."""
    rng = random.Random(args.seed)
    tools = [{"name": "get_weather", "input_schema": WEATHER}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    body = {
        "model": model,
        "system": f"You are agent {uuid.uuid4().hex}.",
        "tools": tools,
        "tool_choice": {"type": "any"},
        "max_tokens": args.max_tokens,
    }
    seen, sent, thread = 0, 0, {"type": "create"}
    for turn in range(args.turns):
        own = {"messages": messages[sent:], "thread": thread} if threaded else {}
        reply = _post(client, "/v1/messages", {**body, "messages": messages, **own})
        sent, thread = len(messages) + 1, {"type": "continue", "previous_message_id": reply["id"]}
        usage = reply["usage"]
        cached = usage.get("cache_read_input_tokens") or 0
        prompt = usage["input_tokens"] + cached
        tally.add(prompt, cached, min(seen, prompt) if turn else 0)
        seen = prompt + usage["output_tokens"]
        messages.append({"role": "assistant", "content": reply["content"]})
        text = result_text(rng, args.result_words)
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if not uses:  # cut by --max-tokens: the answer is plain text
            messages.append({"role": "user", "content": text})
            continue
        # every call answered (Anthropic's rule; smg checks it), the first with the result
        results = [{"type": "tool_result", "tool_use_id": u["id"], "content": "ok"} for u in uses]
        results[0]["content"] = text
        messages.append({"role": "user", "content": results})


def thread_agent(client: httpx.Client, model: str, args: argparse.Namespace, tally: Tally) -> None:
    messages_agent(client, model, args, tally, threaded=True)


def _responses_trace(
    client: httpx.Client,
    model: str,
    args: argparse.Namespace,
    tally: Tally,
    start: dict[str, Any],
    after: Any,
) -> None:
    """An agent through ``/v1/responses``: ``start`` the first body's own fields, ``after``
    (the reply, the new item) the next body's."""
    rng = random.Random(args.seed)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    body: dict[str, Any] = {
        "model": model,
        "instructions": f"You are agent {uuid.uuid4().hex}.",
        "tools": tools,
        "tool_choice": "required",
        "max_output_tokens": args.max_tokens,
        "input": TASK,
        **start,
    }
    seen = 0
    for turn in range(args.turns):
        reply = _post(client, "/v1/responses", body)
        usage = reply["usage"]
        prompt, cached = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        tally.add(prompt, cached, min(seen, prompt) if turn else 0)
        seen = prompt + usage["output_tokens"]
        call = next((item for item in reply["output"] if item["type"] == "function_call"), None)
        text = result_text(rng, args.result_words)
        if call is None:  # cut by --max-tokens: the answer is plain text
            item: dict[str, Any] = {"role": "user", "content": text}
        else:
            item = {"type": "function_call_output", "call_id": call["call_id"], "output": text}
        body = {**body, **after(reply, item)}


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(path, json=body)
    if resp.status_code != 200:
        raise SystemExit(f"{path}: {resp.status_code} {resp.text[:300]}")
    return dict(resp.json())


AGENTS = {
    "chat": chat_agent,
    "responses": responses_agent,
    "conversation": conversation_agent,
    "items": items_agent,
    "messages": messages_agent,
    "thread": thread_agent,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--result-words", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the rates here")
    parser.add_argument(
        "--routes",
        default=",".join(AGENTS),
        help=f"which of {','.join(AGENTS)} to run (comma-separated)",
    )
    args = parser.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rows: dict[str, dict[str, float]] = {}
    started = time.time()
    with httpx.Client(base_url=args.url, headers=headers, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for name in args.routes.split(","):
            agent = AGENTS[name]
            tally = Tally()
            for _ in range(args.agents):
                agent(client, model, args, tally)
            hit, optimal = tally.rates()
            rows[name] = {"prompt_tokens": tally.prompt, "hit_rate": hit, "optimal": optimal}
    print(f"{'route':<12} {'prompt tokens':>14} {'hit rate':>9} {'optimal':>8}")
    for name, row in rows.items():
        print(
            f"{name:<12} {row['prompt_tokens']:>14.0f} {row['hit_rate']:>9.3f} {row['optimal']:>8.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            report = {"started_at": started, "agents": args.agents, "turns": args.turns}
            json.dump({**report, "routes": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
