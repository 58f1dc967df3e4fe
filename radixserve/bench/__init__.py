"""Benchmarks: multi-turn chat and shared-prefix workloads, side by side with baselines.

``radixserve bench multiturn|shared-prefix`` (or ``python -m radixserve.bench ...``) runs the
same token-id trace through radixserve (one run per schedule policy), radixserve with the radix
cache disabled, Hugging Face transformers (recomputing the history; with its KV carried) and,
optionally, another OpenAI-compatible server, one after another. It prints a table and the
ratios, and writes JSON and a PNG plot. Module map:

- ``workload``: the sessions (token ids); ``records``: per-request records, optimal hit rate;
- ``clients`` / ``runner``: Engine, /generate and /v1/completions clients; P parallel workers;
- ``hf_baseline``, ``frontend_driver``, ``servers``: the other ways to run the same sessions;
- ``systems``: the run order; ``report`` / ``plot``: ratios, tables, PNG; ``cli``: arguments.
"""
