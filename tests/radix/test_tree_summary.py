"""summarize_tree against a naive picture of the same tree."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.radix.no_prefix_cache import NoPrefixCache
from radixserve.radix.radix_cache import RadixCache
from radixserve.radix.tree_node import TreeNode
from radixserve.radix.tree_summary import summarize_tree


def _all_nodes(root: TreeNode) -> list[TreeNode]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _subtree(node: TreeNode) -> int:
    return len(node) + sum(_subtree(c) for c in node.children.values())


def _tree(seqs: list[list[int]], page_size: int = 1) -> RadixCache:
    tree = RadixCache(page_size)
    for seq in seqs:
        tree.insert(seq, torch.arange(len(seq), dtype=torch.int64))
    return tree


seqs_strategy = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(seqs=seqs_strategy, max_nodes=st.integers(1, 30))
def test_summary_keeps_the_heaviest_nodes_and_accounts_for_the_rest(
    seqs: list[list[int]], max_nodes: int
) -> None:
    tree = _tree(seqs)
    summary = summarize_tree(tree, max_nodes)
    nodes = [n for n in _all_nodes(tree.root) if n is not tree.root]
    assert summary["total_nodes"] == len(nodes)
    assert summary["total_tokens"] == tree.total_size()
    # sizes shrink down every path, so best-first from the root keeps the top-k by size
    expected = sorted(nodes, key=lambda n: (-_subtree(n), n.id))[:max_nodes]
    shown = summary["nodes"][1:]
    assert sorted(d["id"] for d in shown) == sorted(n.id for n in expected)
    assert summary["shown_nodes"] == len(shown)
    by_id = {d["id"]: d for d in summary["nodes"]}
    seen: set[int] = set()
    for d in summary["nodes"]:  # parents come first; every node is accounted for
        assert d["parent"] is None or d["parent"] in seen
        seen.add(d["id"])
        kept_children = [c for c in by_id.values() if c["parent"] == d["id"]]
        assert d["subtree_tokens"] == (
            d["num_tokens"] + sum(c["subtree_tokens"] for c in kept_children) + d["hidden_tokens"]
        )


def test_a_shared_prefix_is_one_node_with_its_children() -> None:
    prefix = list(range(10, 30))
    tree = _tree([prefix + [1, 2], prefix + [3, 4, 5], prefix + [6]])
    node = tree.match_prefix(prefix).last_node
    tree.inc_lock_ref(node)
    summary = summarize_tree(tree, 100)
    root, shared, *leaves = summary["nodes"]
    assert root["parent"] is None and shared["parent"] == root["id"]
    assert shared["num_tokens"] == 20 and shared["head_ids"] == prefix
    assert shared["locked"] and not shared["evictable"]
    assert sorted(leaf["num_tokens"] for leaf in leaves) == [1, 2, 3]
    assert all(leaf["parent"] == shared["id"] and leaf["evictable"] for leaf in leaves)
    assert summarize_tree(tree, 100, head_tokens=4)["nodes"][1]["head_ids"] == prefix[:4]


def test_paged_tree_and_bad_arguments() -> None:
    tree = _tree([list(range(16)), list(range(8)) + [99] * 8], page_size=4)
    summary = summarize_tree(tree, 10)
    assert sum(d["num_tokens"] for d in summary["nodes"]) == tree.total_size() == 24
    with pytest.raises(ValueError, match="max_nodes"):
        summarize_tree(tree, 0)
    assert summarize_tree(NoPrefixCache(), 10)["disabled"] is True
