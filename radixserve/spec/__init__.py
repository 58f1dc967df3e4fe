"""Speculative decoding's drafts, from text already seen (docs/speculative.md).

Below the runtime and beside ``policy`` and ``models``: it reads token ids and the radix tree's
nodes (as an observer), never a model, a pool or a ``Req``.
"""

from radixserve.spec.cost_model import StepCosts
from radixserve.spec.drafter import DraftLength, NgramDrafter, NgramParams
from radixserve.spec.suffix_match import NO_DRAFT, Draft, suffix_match
from radixserve.spec.tree_index import TreeDraftIndex

__all__ = [
    "NO_DRAFT",
    "Draft",
    "DraftLength",
    "NgramDrafter",
    "NgramParams",
    "StepCosts",
    "TreeDraftIndex",
    "suffix_match",
]
