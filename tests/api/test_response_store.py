"""The stores the Responses API keeps state in, against a naive reference: each tenant's own
least-recently-used list of at most ``capacity`` keys, so that nothing one tenant does changes
what another finds; and a conversation's bound on its items."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.responses.store import Conversation, ConversationStore, TenantStore

TENANTS = [None, "a", "b"]
KEYS = ["k0", "k1", "k2", "k3"]
ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "delete"]), st.sampled_from(TENANTS), st.sampled_from(KEYS)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.integers(1, 3))
def test_a_tenant_store_is_each_tenants_own_lru(
    ops: list[tuple[str, str | None, str]], capacity: int
) -> None:
    store: TenantStore[int] = TenantStore(capacity)
    naive: dict[str | None, list[tuple[str, int]]] = {t: [] for t in TENANTS}  # oldest first
    for n, (op, tenant, key) in enumerate(ops):
        own = naive[tenant]
        at = next((i for i, (k, _) in enumerate(own) if k == key), None)
        if op == "put":
            if at is not None:
                own.pop(at)
            own.append((key, n))
            del own[: max(0, len(own) - capacity)]
            store.put(tenant, key, n)
        elif op == "get":
            expected = None if at is None else own[at][1]
            if at is not None:
                own.append(own.pop(at))
            assert store.get(tenant, key) == expected
        else:
            if at is not None:
                own.pop(at)
            assert store.delete(tenant, key) is (at is not None)
    for tenant in TENANTS:
        for key in KEYS:
            found = dict(naive[tenant]).get(key)
            assert store.get(tenant, key) == found, (tenant, key)
            if found is not None:  # keep the naive recency in step with the store's
                own = naive[tenant]
                own.append(own.pop([k for k, _ in own].index(key)))


def test_a_conversation_has_room_for_at_most_its_bound() -> None:
    store = ConversationStore(capacity=2, max_items=3)
    conversation = Conversation("conv_x", 0, {}, [{"id": "a"}, {"id": "b"}])
    store.check_room(conversation, 1)
    with pytest.raises(ValueError, match="at most 3 items; this one holds 2"):
        store.check_room(conversation, 2)
