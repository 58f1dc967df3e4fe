"""``serve``'s flags for speculative decoding, in SGLang's names, and the ``SpeculativeConfig``
they build (docs/speculative.md)."""

from __future__ import annotations

import argparse

from radixserve.config import SpeculativeConfig
from radixserve.launch.cli_parts import part_from_args

_DEFAULTS = SpeculativeConfig()


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--speculative-algorithm",
        choices=["NGRAM"],
        default=None,
        help="draft tokens from text already seen (the request's own, and what the radix "
        "cache holds in its namespace) and verify them in one forward (off by default)",
    )
    add(
        "--speculative-num-draft-tokens",
        type=int,
        default=_DEFAULTS.speculative_num_draft_tokens,
        help="tokens a request computes in one verify: its last one and up to this minus one drafts",
    )
    add(
        "--speculative-ngram-min-match-window-size",
        type=int,
        default=_DEFAULTS.speculative_ngram_min_match_window_size,
        help="the shortest run of latest tokens a draft's match needs",
    )
    add(
        "--speculative-ngram-max-match-window-size",
        type=int,
        default=_DEFAULTS.speculative_ngram_max_match_window_size,
        help="the longest run of latest tokens a match compares",
    )
    add(
        "--speculative-ngram-capacity",
        type=int,
        default=_DEFAULTS.speculative_ngram_capacity,
        help="tokens of the radix cache's sequences the draft index holds",
    )
    add(
        "--speculative-ngram-max-batch-size",
        type=int,
        default=None,
        help="no drafts when more requests than this decode together (default: the cost model)",
    )
    add(
        "--speculative-cost-model",
        choices=["measured", "prior"],
        default=_DEFAULTS.speculative_cost_model,
        help="what decides which drafts to verify: step times measured at start (the default), "
        "or a fixed prior (a token costs 0.14 of a step), so that what is drafted depends on "
        "the texts alone, not on how busy the machine was at start",
    )


def speculative_part(args: argparse.Namespace) -> SpeculativeConfig:
    return part_from_args(SpeculativeConfig, args)
