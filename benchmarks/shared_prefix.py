"""Shared-prefix groups (SGLang's generated-shared-prefix shape) against baselines, in one run.

A thin wrapper of ``radixserve bench shared-prefix`` (``python -m radixserve.bench
shared-prefix``); every flag is the same, e.g.::

    python benchmarks/shared_prefix.py                       # 4 groups x 8, system 512, at once
    python benchmarks/shared_prefix.py --request-rate 2      # Poisson arrivals, 2 req/s
    python benchmarks/shared_prefix.py --policy sweep --baselines none
"""

from __future__ import annotations

import sys

from radixserve.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["shared-prefix", *sys.argv[1:]]))
