"""Parallel branches with ``fork``, tree-of-thought style, against a running server
(``make serve``).

    .venv/bin/python examples/parallel_fork.py [URL]     # default http://127.0.0.1:30000

The question is prefilled once at the fork; the three branches then run in parallel (one thread
each, batched together by the server), each judges itself with ``select``, and the parent joins
their results back into one prompt for the final answer.
"""

from __future__ import annotations

import sys
from typing import Any

from radixserve.frontend import RuntimeEndpoint, function, gen, select

DEFAULT_URL = "http://127.0.0.1:30000"


@function
def tree_of_thought(s: Any, question: str, num_branches: int = 3) -> None:
    s += f"Question: {question}\n"
    forks = s.fork(num_branches)
    for i, branch in enumerate(forks):
        branch += f"Approach {i + 1}: " + gen("thought", max_tokens=32, stop="\n", seed=i)
        branch += "\nIs this approach promising? " + select("verdict", choices=["yes", "no"])
    forks.join()
    for i, branch in enumerate(forks):
        s += f"Approach {i + 1} ({branch['verdict']}): {branch['thought']}\n"
    s += "Final answer: " + gen("answer", max_tokens=32, stop="\n")


def main(url: str) -> None:
    backend = RuntimeEndpoint(url)
    state = tree_of_thought.run(
        question="How can a server reuse work across requests that share a prompt?",
        backend=backend,
        temperature=0.7,
    )
    print(state.text())
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL)
