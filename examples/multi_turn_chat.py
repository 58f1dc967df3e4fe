"""Multi-turn chat with the role helpers, then the same program streamed, against a running
server (``make serve``; its embedded smoke-test model answers gibberish, the plumbing is real).

    .venv/bin/python examples/multi_turn_chat.py [URL]     # default http://127.0.0.1:30000

Each turn's prompt is the whole conversation so far; the server's radix cache finds the earlier
turns, so ``cached_tokens`` grows with the conversation.
"""

from __future__ import annotations

import sys
from typing import Any

from radixserve.frontend import RuntimeEndpoint, assistant, function, gen, system, user

DEFAULT_URL = "http://127.0.0.1:30000"
QUESTIONS = [
    "What is a radix tree?",
    "How does an LLM server use one?",
    "Summarize both answers in one sentence.",
]


@function
def multi_turn_chat(s: Any, questions: list[str]) -> None:
    s += system("You are a helpful assistant. Answer briefly.")
    for i, question in enumerate(questions):
        s += user(question)
        s += assistant(gen(f"answer_{i}", max_tokens=48))


def main(url: str) -> None:
    backend = RuntimeEndpoint(url)
    print(f"chat template: {backend.chat_template.source}")
    state = multi_turn_chat.run(questions=QUESTIONS, backend=backend, temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']!r}")
    for i in range(len(QUESTIONS)):
        meta = state.get_meta_info(f"answer_{i}")
        print(
            f"turn {i + 1}: {meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} cached"
        )

    print("\nstreamed:")
    streamed = multi_turn_chat.run(questions=QUESTIONS[:1], backend=backend, stream=True)
    for piece in streamed.text_iter("answer_0"):
        print(piece, end="", flush=True)
    print()
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL)
