"""Metrics by tenant: an operator scrapes the server's, a tenant its own.

:class:`MetricsByTenant` is the tokenizer manager's output observer: every output counts in the
server's :class:`ServingMetrics` and in its tenant's (the scope of its rid,
``server/rid_scope.py``). A tenant's registry has the same names, counting only its requests,
and none of the scheduler's gauges (queue lengths, KV usage, the cache's hit rate), which are
everyone's. At most ``max_tenants`` registries are kept, the least recently used dropped
first (a gateway's tenant header can name any number of tenants).
"""

from __future__ import annotations

import collections
from typing import Any

from radixserve.api.operator.metrics import ServingMetrics
from radixserve.server.io_struct import TextOutput
from radixserve.server.request_state import ReqState
from radixserve.server.rid_scope import scope_of

MAX_TENANTS = 1024


class MetricsByTenant:
    def __init__(
        self, model_name: str, speculative: bool = False, max_tenants: int = MAX_TENANTS
    ) -> None:
        """``speculative``: the server drafts (the server's registry has the spec counters)."""
        self.model_name = model_name
        self.max_tenants = max_tenants
        self.server = ServingMetrics(model_name, speculative)
        self._tenants: collections.OrderedDict[str, ServingMetrics] = collections.OrderedDict()

    def on_output(self, state: ReqState, out: TextOutput, now: float) -> None:
        self.server.on_output(state, out, now)
        tenant = scope_of(state.request.rid)
        if tenant is not None:
            self.of(tenant).on_output(state, out, now)

    def of(self, tenant: str) -> ServingMetrics:
        """``tenant``'s metrics (empty ones for a tenant not seen yet)."""
        metrics = self._tenants.get(tenant)
        if metrics is None:
            metrics = self._tenants[tenant] = ServingMetrics(self.model_name)
            while len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        return metrics

    def usage(self, tenant: str) -> dict[str, Any]:
        """``tenant``'s own counters, in the names of the scheduler's stats."""
        return self.of(tenant).usage()
