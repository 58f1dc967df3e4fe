"""Multi-turn chat (SGLang's benchmark/multi_turn_chat shape) against baselines, in one run.

A thin wrapper of ``radixserve bench multiturn`` (``python -m radixserve.bench multiturn``);
every flag is the same, e.g.::

    python benchmarks/multiturn_chat.py --shape a          # 8 x 4 turns, 64/32 tokens, P=8
    python benchmarks/multiturn_chat.py --shape b          # 256-512-token turns, 4-8-token answers
    python benchmarks/multiturn_chat.py --policy sweep     # fcfs, lpm, dfs-weight
    python benchmarks/multiturn_chat.py --quick            # tiny model, under a minute
"""

from __future__ import annotations

import sys

from radixserve.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["multiturn", *sys.argv[1:]]))
