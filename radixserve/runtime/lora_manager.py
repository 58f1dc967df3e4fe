"""LoraManager: the LoRA adapters a scheduler serves, by name, and which are in memory.

- **Names.** ``--lora-paths NAME=DIR`` at start, :meth:`load` / :meth:`unload` at run time. A
  request names its adapter; :meth:`acquire` resolves the name once, when the request is queued,
  to the adapter's ``uid`` (the sha256 of its files), which the request keeps to its end. An
  unloaded name takes no new request at once; the requests already holding its uid finish under
  it, and its weights go when the last of them ends (never under a running request).
- **The cache.** The uid is the request's radix-cache namespace (:meth:`namespace`): KV computed
  under an adapter is only ever matched by requests under the same adapter files. The caller's
  own namespace (a tenant, a ``cache_salt``) is kept beside it, and no caller may name an
  adapter's namespace itself.
- **Memory.** At most ``max_loaded`` adapters keep their weights in memory; a batch that needs
  another reads it from disk again and drops the least recently used one that no running
  request needs (``--max-loaded-loras``).
- **Batches.** At most ``max_per_batch`` distinct adapters run together (the base model is not
  counted): :meth:`gate` is the admission test, and the pass stops at the first request that
  would exceed it, as SGLang's does, so no request overtakes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from radixserve.config import EngineConfig
from radixserve.models.lora import LoraAdapter, LoraBatch, LoraStacks, adapter_uid, load_adapter
from radixserve.models.model_config import ModelConfig
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.types import Req

NAMESPACE_PREFIX = "lora:"

AdapterLoader = Callable[[str], LoraAdapter]


def check_adapter(path: str, config: EngineConfig) -> None:
    """Read the adapter at ``path`` for ``config``'s model on the CPU, as a scheduler would
    (``load_adapter``), and drop it: ``ValueError`` naming what makes it unusable. The HTTP
    process runs this before it asks the scheduler to load an adapter, and ``serve`` before it
    starts one with ``--lora-paths``, so a malformed adapter is refused before the scheduler
    loop ever reads it."""
    if config.model_path is None:
        raise ValueError("no model to read a LoRA adapter for")
    model = ModelConfig.from_dir(config.model_path)
    load_adapter(path, model, torch.float32, torch.device("cpu"), config.lora.max_lora_rank)


@dataclass(slots=True)
class _Entry:
    uid: str
    path: str
    names: set[str] = field(default_factory=set)
    refs: int = 0  # requests queued or running under it
    pinned: bool = False  # never dropped from memory


class LoraManager:
    def __init__(
        self,
        loader: AdapterLoader | None,
        max_per_batch: int = 8,
        max_loaded: int | None = None,
        identify: Callable[[str], str] = adapter_uid,
    ) -> None:
        """``loader`` reads an adapter directory for this model (``None``: a model that serves
        no adapters); ``identify`` names a directory's content (the simulator's adapters have
        none: it passes their names)."""
        self.loader = loader
        self.identify = identify
        self.max_per_batch = max_per_batch
        self.max_loaded = max_loaded
        self.names: dict[str, str] = {}  # name -> uid
        self.entries: dict[str, _Entry] = {}  # uid -> entry, while named or referenced
        self.loaded: OrderedDict[str, LoraAdapter] = OrderedDict()  # uid -> weights, LRU first
        self.num_loads = 0  # adapter reads from disk (the first one included)
        self.stacks = LoraStacks()  # the stacked deltas of decode batches (models/lora/batch.py)
        self.unreadable: list[tuple[Req, Exception]] = []  # see take_unreadable

    @classmethod
    def of(cls, config: EngineConfig, loader: AdapterLoader | None) -> LoraManager:
        """The manager of ``config``'s LoRA fields, serving its ``lora_paths`` already."""
        manager = cls(loader, config.lora.max_loras_per_batch, config.lora.max_loaded_loras)
        for name, path in config.lora.lora_paths:
            manager.load(name, path)
        return manager

    @classmethod
    def weightless(cls, max_per_batch: int) -> LoraManager:
        """Adapters that are names only, no files or weights (the simulator's, whose model is
        a cost model); their namespaces and the per-batch bound hold as for real ones."""

        def adapter(name: str) -> LoraAdapter:
            return LoraAdapter(name, name, 0, (), torch.device("cpu"))

        return cls(adapter, max_per_batch, identify=lambda name: name)

    # ---- names -------------------------------------------------------------------------------
    def load(self, name: str, path: str, pinned: bool = False) -> None:
        """Serve the adapter at ``path`` as ``name`` (``pinned``: never dropped from memory).
        ``ValueError``: the name is taken, this model serves no adapters, the directory is not
        an adapter this model can apply (``load_adapter``'s reasons: its files are read without
        blocking, whatever they are), or pinning it would leave no room in memory."""
        if self.loader is None:
            raise ValueError("this scheduler runs no model that could apply a LoRA adapter")
        if not name or ":" in name or name in self.names:
            why = "is already loaded" if name in self.names else "is not a valid adapter name"
            raise ValueError(f"the LoRA adapter name {name!r} {why}")
        if pinned and self.max_loaded is not None:
            if sum(e.pinned for e in self.entries.values()) + 1 >= self.max_loaded:
                raise ValueError(f"pinning leaves no room: --max-loaded-loras {self.max_loaded}")
        uid = self.identify(path)
        if uid not in self.loaded:
            self._remember(uid, self._read(path))  # validated against the model now
        entry = self.entries.setdefault(uid, _Entry(uid, path))
        entry.names.add(name)
        entry.pinned |= pinned
        self.names[name] = uid

    def unload(self, name: str) -> None:
        """Stop serving ``name`` (``ValueError`` if it is not loaded)."""
        uid = self.names.pop(name, None)
        if uid is None:
            raise ValueError(f"the LoRA adapter {name!r} is not loaded")
        entry = self.entries[uid]
        entry.names.discard(name)
        self._drop_if_unused(entry)

    def label(self, namespace: str | None) -> str | None:
        """The adapter of a radix-cache ``namespace`` (see :meth:`namespace`) by its names;
        ``None`` for the base model's KV."""
        if not namespace or not namespace.startswith(NAMESPACE_PREFIX):
            return None
        uid = namespace.removeprefix(NAMESPACE_PREFIX).split("|", 1)[0]
        entry = self.entries.get(uid)
        return ", ".join(sorted(entry.names)) if entry and entry.names else f"{uid} (unloaded)"

    def adapters(self) -> dict[str, str]:
        """name -> directory, of every adapter served."""
        return {name: self.entries[uid].path for name, uid in self.names.items()}

    # ---- requests ------------------------------------------------------------------------------
    def acquire(self, name: str | None, extra_key: str | None) -> tuple[str | None, str | None]:
        """A new request's adapter uid (``None``: the base model under ``name`` None), held
        until :meth:`release`, and its radix-cache namespace (see :meth:`namespace`).
        ``ValueError`` for a name not loaded or an ``extra_key`` naming an adapter's namespace."""
        if extra_key is not None and extra_key.startswith(NAMESPACE_PREFIX):
            raise ValueError(f"extra_key may not start with {NAMESPACE_PREFIX!r}")
        if name is None:
            return None, extra_key
        uid = self.names.get(name)
        if uid is None:
            known = ", ".join(sorted(self.names)) or "none"
            raise ValueError(f"the LoRA adapter {name!r} is not loaded (loaded: {known})")
        self.entries[uid].refs += 1
        return uid, self.namespace(uid, extra_key)

    def release(self, req: Req) -> None:
        """``req`` has ended: its hold on its adapter goes."""
        if req.lora_id is None:
            return
        entry = self.entries[req.lora_id]
        entry.refs -= 1
        self._drop_if_unused(entry)

    @staticmethod
    def namespace(uid: str, extra_key: str | None) -> str:
        """The radix-cache namespace of a request under adapter ``uid`` with the caller's
        ``extra_key`` (which :meth:`acquire` checked never starts with the prefix)."""
        return f"{NAMESPACE_PREFIX}{uid}" + (f"|{extra_key}" if extra_key else "")

    # ---- batches ---------------------------------------------------------------------------------
    def gate(self, running: Iterable[Req]) -> Callable[[Req, Sequence[Req]], bool] | None:
        """The admission test of one pass: may a request join ``running`` and the requests
        admitted so far? ``None`` when no adapter is served (nothing to test)."""
        if not self.entries:
            return None
        running_uids = {r.lora_id for r in running if r.lora_id is not None}

        def may_join(req: Req, admitted: Sequence[Req]) -> bool:
            if req.lora_id is None:
                return True
            uids = running_uids | {r.lora_id for r in admitted if r.lora_id is not None}
            uids.add(req.lora_id)
            if len(uids) > self.max_per_batch:
                return False
            try:  # in memory before it is admitted: read back now if it was dropped
                self._weights(req.lora_id, uids)
            except (OSError, ValueError, RuntimeError) as exc:  # the adapter's own failure
                self.unreadable.append((req, exc))
                return False
            return True

        return may_join

    def take_unreadable(self) -> list[tuple[Req, Exception]]:
        """The requests :meth:`gate` refused because their adapter could not be read back
        (its files deleted or changed since loading), with why; the scheduler fails them."""
        out, self.unreadable = self.unreadable, []
        return out

    def attach(self, batch: ScheduleBatch, keep: Iterable[Req] = ()) -> None:
        """Give ``batch``'s forward its :class:`LoraBatch` (see :meth:`forward_lora`)."""
        fb = batch.forward_batch
        assert fb is not None
        fb.lora = self.forward_lora(batch.reqs, fb.extend_seq_lens_list, keep)

    def forward_lora(
        self, reqs: Sequence[Req], token_counts: Sequence[int], keep: Iterable[Req] = ()
    ) -> LoraBatch | None:
        """The :class:`LoraBatch` of a forward over ``reqs`` (``token_counts`` rows each),
        reading back from disk any adapter it needs that was dropped from memory; ``keep``: the
        other requests whose adapters must not be dropped for it (the running batch)."""
        if not self.entries:
            return None
        needed = {r.lora_id for r in (*reqs, *keep) if r.lora_id is not None}
        adapters = [None if r.lora_id is None else self._weights(r.lora_id, needed) for r in reqs]
        if not any(adapters):
            return None
        device = next(a for a in adapters if a is not None).device
        return LoraBatch.build(adapters, token_counts, device, self.stacks)

    # ---- memory --------------------------------------------------------------------------------
    def _weights(self, uid: str, needed: set[str]) -> LoraAdapter:
        adapter = self.loaded.get(uid)
        if adapter is not None:
            self.loaded.move_to_end(uid)
            return adapter
        adapter = self._read(self.entries[uid].path)
        if adapter.uid != uid:
            raise RuntimeError(f"the adapter files at {adapter.path!r} changed since loading")
        self._remember(uid, adapter, needed)
        return adapter

    def _read(self, path: str) -> LoraAdapter:
        assert self.loader is not None
        self.num_loads += 1
        return self.loader(path)

    def _remember(self, uid: str, adapter: LoraAdapter, needed: set[str] | None = None) -> None:
        self.loaded[uid] = adapter
        needed = needed or set()
        if self.max_loaded is None:
            return
        for victim in list(self.loaded):
            if len(self.loaded) <= self.max_loaded:
                break
            if victim != uid and victim not in needed and not self.entries[victim].pinned:
                del self.loaded[victim]
                self.stacks.clear()

    def _drop_if_unused(self, entry: _Entry) -> None:
        if not entry.names and entry.refs == 0:
            del self.entries[entry.uid]
            if self.loaded.pop(entry.uid, None) is not None:
                self.stacks.clear()  # no stack keeps its weights alive

    def check_integrity(self, reqs: Iterable[Req]) -> None:
        """Every adapter's hold count equals the requests holding it."""
        counts: dict[str, int] = {}
        for req in reqs:
            if req.lora_id is not None:
                counts[req.lora_id] = counts.get(req.lora_id, 0) + 1
        held = {uid: e.refs for uid, e in self.entries.items() if e.refs}
        assert held == counts, f"LoRA holds {held} != requests {counts}"
