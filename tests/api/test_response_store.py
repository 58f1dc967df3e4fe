"""The stores the Responses API keeps state in, against a naive reference: each tenant's own
least-recently-used list of at most ``capacity`` keys and ``max_bytes`` of their sizes, so that
nothing one tenant does changes what another finds; and a conversation's bounds on its items
and their bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.responses.store import (
    Conversation,
    ConversationStore,
    TenantStore,
    json_bytes,
)

TENANTS = [None, "a", "b"]
KEYS = ["k0", "k1", "k2", "k3"]
ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "delete", "grow"]),
        st.sampled_from(TENANTS),
        st.sampled_from(KEYS),
        st.integers(0, 12),  # a put's size, a growth's bytes
    ),
    max_size=60,
)
Naive = list[list[Any]]  # a tenant's [key, value, size], oldest first


def _evict(own: Naive, capacity: int, max_bytes: int) -> None:
    """The naive bound: the oldest out while past either, the newest always kept."""
    while len(own) > 1 and (len(own) > capacity or sum(e[2] for e in own) > max_bytes):
        own.pop(0)


@settings(max_examples=400, deadline=None)
@given(ops=ops, capacity=st.integers(1, 3), max_bytes=st.integers(0, 20))
def test_a_tenant_store_is_each_tenants_own_lru(
    ops: list[tuple[str, str | None, str, int]], capacity: int, max_bytes: int
) -> None:
    store: TenantStore[int] = TenantStore(capacity, max_bytes)
    naive: dict[str | None, Naive] = {t: [] for t in TENANTS}
    for n, (op, tenant, key, size) in enumerate(ops):
        own = naive[tenant]
        at = next((i for i, e in enumerate(own) if e[0] == key), None)
        if op == "put":
            stored = store.put(tenant, key, n, size)
            assert stored is (size <= max_bytes)
            if stored:
                if at is not None:
                    own.pop(at)
                own.append([key, n, size])
                _evict(own, capacity, max_bytes)
        elif op == "grow":
            if at is None:
                continue
            own.append(own.pop(at))
            own[-1][2] += size
            _evict(own, capacity, max_bytes)
            store.resize(tenant, key, size)
        elif op == "get":
            expected = None if at is None else own[at][1]
            if at is not None:
                own.append(own.pop(at))
            assert store.get(tenant, key) == expected
        else:
            if at is not None:
                own.pop(at)
            assert store.delete(tenant, key) is (at is not None)
        assert store.stored_bytes(tenant) == sum(e[2] for e in own)
    for tenant in TENANTS:
        for key in KEYS:
            found = {k: v for k, v, _ in naive[tenant]}.get(key)
            assert store.get(tenant, key) == found, (tenant, key)
            if found is not None:  # keep the naive recency in step with the store's
                own = naive[tenant]
                own.append(own.pop([e[0] for e in own].index(key)))


def test_a_conversation_has_room_for_at_most_its_bounds() -> None:
    item = {"id": "a", "type": "message", "role": "user", "content": "x" * 50}
    store = ConversationStore(capacity=2, max_bytes=4 * json_bytes([item]), max_items=3)
    conversation = Conversation("conv_x", 0, {})
    store.grow("t", conversation, [item, item])
    store.put("t", conversation.id, conversation, conversation.size)
    assert store.stored_bytes("t") == conversation.size == json_bytes([item, item])
    store.check_room(conversation, 1, json_bytes([item]))
    with pytest.raises(ValueError, match="at most 3 items; this one holds 2"):
        store.check_room(conversation, 2, json_bytes([item]))
    store.grow("t", conversation, [item])
    assert store.stored_bytes("t") == conversation.size
    store.remove("t", conversation, 0)
    store.remove("t", conversation, 0)
    assert store.stored_bytes("t") == conversation.size == json_bytes([item])
    big = {**item, "content": "x" * 400}
    with pytest.raises(ValueError, match="holds at most .* bytes of items"):
        store.check_room(conversation, 1, json_bytes([big]))


def test_a_growing_conversation_pushes_out_the_tenants_oldest_alone() -> None:
    item = {"id": "a", "type": "message", "role": "user", "content": "x" * 50}
    size = json_bytes([item])
    store = ConversationStore(capacity=8, max_bytes=3 * size)
    old, new, other = (Conversation(f"conv_{k}", 0, {}) for k in "abc")
    for tenant, conversation in (("t", old), ("t", new), ("u", other)):
        store.grow(tenant, conversation, [item])
        store.put(tenant, conversation.id, conversation, conversation.size)
    store.grow("t", new, [item, item])  # 4 items' bytes for t: its oldest goes
    assert store.get("t", old.id) is None and store.get("t", new.id) is new
    assert store.get("u", other.id) is other and store.stored_bytes("u") == size
