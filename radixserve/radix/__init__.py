"""Prefix caches: the radix tree of cached prefixes and its null object."""

from radixserve.radix.base import InsertResult, MatchResult, PrefixCache
from radixserve.radix.no_prefix_cache import NoPrefixCache
from radixserve.radix.radix_cache import RadixCache
from radixserve.radix.tree_node import TreeNode

__all__ = ["InsertResult", "MatchResult", "NoPrefixCache", "PrefixCache", "RadixCache", "TreeNode"]
