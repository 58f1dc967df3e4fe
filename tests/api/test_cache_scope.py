"""Each tenant's caches beside the radix tree are its own: a grammar compiled, a template's
call form learned, for one tenant is built again for another, and no tenant's entries evict
another's, so how long a request takes to start tells a tenant nothing of the others'."""

from __future__ import annotations

import collections
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.access.tenants import Tenants
from radixserve.api.formats.call_form import CallForms
from radixserve.runtime.grammar.backend import CompileCache
from radixserve.runtime.io_struct import cache_scope

pytestmark = pytest.mark.timeout(120)

NAMES = st.text(st.sampled_from("ab|%:k-"), min_size=1, max_size=6)
CLIENT_VALUES = st.none() | st.text(st.sampled_from("ab|%:tenant"), max_size=12)


def _state(tenant: str | None) -> Any:
    return types.SimpleNamespace(tenant=tenant)


@settings(max_examples=300, deadline=None)
@given(NAMES, NAMES, CLIENT_VALUES, CLIENT_VALUES, CLIENT_VALUES, CLIENT_VALUES)
def test_a_namespaces_scope_is_its_tenant_whatever_the_client_sends(
    a: str, b: str, key_a: str | None, salt_a: str | None, key_b: str | None, salt_b: str | None
) -> None:
    tenants = Tenants(keys=(("x", "k1"),))
    scope_a = cache_scope(tenants.namespace(_state(a), salt_a, key_a))
    scope_b = cache_scope(tenants.namespace(_state(b), salt_b, key_b))
    assert scope_a is not None and scope_a == tenants.cache_scope(_state(a))
    assert (scope_a == scope_b) == (a == b)  # a '|' in a gateway's tenant name included
    # with no tenant (an open server) or a shared cache, nothing a client sends makes a scope
    assert cache_scope(Tenants().namespace(_state(None), salt_a, key_a)) is None
    shared = Tenants(keys=(("x", "k1"),), shared_cache=True)
    assert cache_scope(shared.namespace(_state(a), salt_a, key_a)) is None


def _counted(built: collections.Counter[Any]) -> Any:
    def build(key: Any) -> str:
        built[key] += 1
        return f"compiled {key}"

    return build


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 5)), max_size=60))
def test_the_compile_cache_is_a_separate_lru_per_scope(gets: list[tuple[str, int]]) -> None:
    """Against a naive reference: one LRU of ``max_entries`` per scope."""
    built: collections.Counter[Any] = collections.Counter()
    cache = CompileCache(_counted(built), max_entries=3)
    reference: dict[str, list[Any]] = {}
    expected: collections.Counter[Any] = collections.Counter()
    for scope, n in gets:
        key = ("regex", str(n))
        own = reference.setdefault(scope, [])
        if key in own:
            own.remove(key)
        else:
            expected[key] += 1
            if len(own) == 3:
                own.pop(0)
        own.append(key)
        assert cache.get(key, scope) == f"compiled {key}"
    assert built == expected
    assert len(cache) == sum(len(own) for own in reference.values())


def test_a_call_form_is_learned_again_for_each_scope() -> None:
    renders: list[str | None] = []

    def render_text(messages: Any, tools: Any, add_generation_prompt: bool, **kw: Any) -> str:
        renders.append(kw.get("who"))
        return "no tools here"  # a template that writes no calls: no form, learned all the same

    forms = CallForms(render_text, ["<end>"], [], max_entries=2)
    assert forms.of({"who": 1}, "tenant:a") is None
    learned = len(renders)
    assert learned > 0
    forms.of({"who": 1}, "tenant:a")
    assert len(renders) == learned  # kept
    forms.of({"who": 1}, "tenant:b")
    assert len(renders) == 2 * learned  # another tenant learns its own
    for who in (2, 3, 4):  # tenant b fills its bound: tenant a's form stays
        forms.of({"who": who}, "tenant:b")
    before = len(renders)
    forms.of({"who": 1}, "tenant:a")
    assert len(renders) == before
