"""Attention backends against the paged-attention contract (base.py), without a model.

The pool holds random K/V for cached prefixes at scattered slots; a batch extends or decodes on
top. ``paged_attention_reference`` (FlashInfer's contract in plain torch, fed CSR metadata built
here by hand) is the reference; ``TorchNativeBackend`` and ``FlashInferBackend`` (with the
reference wrappers on CPU, with real FlashInfer on a GPU) must reproduce it.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from typing import Any

import pytest
import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention import flashinfer_backend
from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.cpu_kernel import CpuKernelBackend
from radixserve.models.attention.flashinfer_backend import (
    RAGGED_MODES,
    FlashInferBackend,
    build_paged_kv_metadata,
)
from radixserve.models.attention.flashinfer_wrappers import decode_on_tensor_cores
from radixserve.models.attention.paged_reference import (
    ReferenceWrappers,
    merge_state_reference,
    paged_attention_reference,
)
from radixserve.models.attention.registry import create_attention_backend, default_backend_name
from radixserve.models.attention.torch_native import TorchNativeBackend
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.kernels import TORCH_ONLY, CpuKernels

NUM_SLOTS = 512
WINDOW = 5


class Setup:
    """A pool with cached prefixes at random slots and a batch (extend or decode) on top."""

    def __init__(
        self,
        spec: AttentionSpec,
        prefix_lens: list[int],
        extend_lens: list[int],
        decode: bool,
        dtype: torch.dtype,
        device: str = "cpu",
        num_slots: int = NUM_SLOTS,
    ) -> None:
        gen = torch.Generator().manual_seed(sum(prefix_lens) * 31 + sum(extend_lens))
        self.spec = spec
        layers = len(spec.sliding_windows)
        self.kv = KVCache(layers, num_slots, spec.num_kv_heads, spec.head_dim, dtype, device)
        for buf in self.kv.k_buffer + self.kv.v_buffer:
            buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        self.pool = ReqToTokenPool(8, max(seq_lens) + 3, device)
        rows = [5, 0, 3, 7][: len(prefix_lens)]
        perm = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()  # slot 0 is padding
        new_slots = []
        for row, p, s in zip(rows, prefix_lens, seq_lens, strict=True):
            slots, perm = perm[:s], perm[s:]
            self.pool.req_to_token[row, :s] = torch.tensor(slots, dtype=torch.int32)
            new_slots += slots[p:]
        out_loc = torch.tensor(new_slots, dtype=torch.int64)
        n = len(new_slots)
        if decode:
            self.batch = ForwardBatch.decode(
                torch.zeros(n, dtype=torch.int64), rows, seq_lens, out_loc, device
            )
        else:
            self.batch = ForwardBatch.extend(
                [0] * n, rows, prefix_lens, extend_lens, out_loc, device
            )
        self.q = torch.randn(n, spec.num_heads, spec.head_dim, generator=gen).to(dtype).to(device)
        self.k = (
            torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(dtype).to(device)
        )
        self.v = (
            torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(dtype).to(device)
        )
        self.rows, self.seq_lens, self.extend_lens = rows, seq_lens, extend_lens

    def run(self, backend: object, layer: int) -> torch.Tensor:
        backend.init_forward_metadata(self.batch)  # type: ignore[attr-defined]
        fwd = backend.forward_decode if self.batch.is_decode else backend.forward_extend  # type: ignore[attr-defined]
        return fwd(self.q, self.k, self.v, layer, self.batch)

    def hand_metadata(self) -> tuple[list[int], list[int], list[int]]:
        """CSR metadata written out request by request (page size 1)."""
        qo, kv, indices = [0], [0], []
        for row, s, e in zip(self.rows, self.seq_lens, self.extend_lens, strict=True):
            qo.append(qo[-1] + e)
            kv.append(kv[-1] + s)
            indices += self.pool.req_to_token[row, :s].tolist()
        return qo, kv, indices

    def reference(self, layer: int) -> torch.Tensor:
        """The contract computed from the pool after the new K/V were written."""
        qo, kv, indices = self.hand_metadata()
        window = self.spec.sliding_windows[layer]
        k_buf, v_buf = self.kv.get_kv(layer)
        out = paged_attention_reference(
            self.q.cpu(),
            k_buf.cpu().unsqueeze(1),
            v_buf.cpu().unsqueeze(1),
            torch.tensor(qo),
            torch.tensor(kv),
            torch.tensor(indices),
            torch.ones(len(self.rows), dtype=torch.int32),
            causal=True,
            sm_scale=self.spec.scaling,
            window_left=-1 if window is None else window - 1,
        )
        return out.reshape(len(out), -1)


SPECS = {
    "gqa2": AttentionSpec(4, 2, 32, 32**-0.5, (None, WINDOW)),
    "gqa3": AttentionSpec(6, 2, 16, 16**-0.5, (WINDOW, None)),
    "mqa": AttentionSpec(4, 1, 8, 0.3, (None, None)),
    "mha": AttentionSpec(2, 2, 16, 16**-0.5, (None, WINDOW)),
}
BATCHES = {
    "no_prefix": ([0, 0, 0], [7, 1, 12]),
    "prefix": ([3, 10, 0], [4, 1, 9]),
    "uniform": ([6, 6], [5, 5]),
    "single": ([11], [13]),
    "long": ([0, 20], [150, 70]),  # several query blocks of the extend path, one partial
}


def _lengths(batch: tuple[list[int], list[int]], decode: bool) -> tuple[list[int], list[int]]:
    """(prefix, extend) lengths of a batch; decode: one new token per request on top of all."""
    prefix, extend = batch
    if decode:
        return [p + e - 1 for p, e in zip(prefix, extend, strict=True)], [1] * len(prefix)
    return prefix, extend


@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("batch_name", sorted(BATCHES))
@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_torch_native_and_flashinfer_metadata_follow_the_contract(
    spec_name: str, batch_name: str, decode: bool
) -> None:
    spec = SPECS[spec_name]
    prefix, extend = _lengths(BATCHES[batch_name], decode)
    for layer in range(2):
        native = Setup(spec, prefix, extend, decode, torch.float32)
        before = [b.clone() for b in native.kv.k_buffer]
        out_native = native.run(TorchNativeBackend(spec, native.kv, native.pool), layer)
        written = native.batch.out_cache_loc
        untouched = torch.ones(NUM_SLOTS, dtype=torch.bool)
        untouched[written] = False
        assert torch.equal(native.kv.k_buffer[layer][untouched], before[layer][untouched])
        assert torch.equal(native.kv.k_buffer[layer][written], native.k)
        torch.testing.assert_close(out_native, native.reference(layer), rtol=1e-5, atol=1e-5)

        # extends split (ragged + prefix, merged), one paged pass, or ragged where nothing is cached
        for ragged in RAGGED_MODES:
            paged = Setup(spec, prefix, extend, decode, torch.float32)
            backend = FlashInferBackend(
                spec, paged.kv, paged.pool, wrappers=ReferenceWrappers(), ragged_prefill=ragged
            )
            out_paged = paged.run(backend, layer)
            torch.testing.assert_close(out_paged, out_native, rtol=1e-5, atol=1e-5)
            assert torch.equal(paged.kv.k_buffer[layer], native.kv.k_buffer[layer])


class SpyWrappers(ReferenceWrappers):
    """The reference wrappers, each ``plan`` and ``run`` call recorded as (kind, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def _spy(self, kind: str, wrapper: object) -> object:
        plan, run = wrapper.plan, wrapper.run  # type: ignore[attr-defined]

        def spy_plan(*args: object, **kw: object) -> None:
            self.calls.append((f"{kind}.plan", {"args": args, **kw}))
            plan(*args, **kw)

        def spy_run(*args: object, **kw: object) -> object:
            self.calls.append((f"{kind}.run", kw))
            return run(*args, **kw)

        wrapper.plan, wrapper.run = spy_plan, spy_run  # type: ignore[attr-defined]
        return wrapper

    def prefill(self) -> Any:
        return self._spy("paged", super().prefill())

    def ragged(self) -> Any:
        return self._spy("ragged", super().ragged())

    def merge_state(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("merge", {}))
        return super().merge_state(*args)

    def graph_decode(self, buffers: Any, bs: int) -> Any:
        return self._spy("graph", super().graph_decode(buffers, bs))

    def fast_decode_plan(self, wrapper: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("fast_plan", kwargs))
        super().fast_decode_plan(wrapper, *args, **kwargs)


SPLIT = ["ragged.plan", "paged.plan", "ragged.run", "paged.run", "merge"]


@pytest.mark.parametrize(
    ("mode", "prefix", "expected"),
    [
        ("cold", [0, 0, 0], ["ragged.plan", "ragged.run"]),  # nothing cached: no page table
        ("cold", [3, 10, 0], ["paged.plan", "paged.run"]),  # a prefix: one causal paged pass
        ("split", [0, 0, 0], ["ragged.plan", "ragged.run"]),
        ("split", [3, 10, 0], SPLIT),  # ragged new tokens, the paged prefix, merged
        ("off", [0, 0, 0], ["paged.plan", "paged.run"]),
    ],
    ids=["cold-no_prefix", "cold-prefix", "split-no_prefix", "split-prefix", "off-no_prefix"],
)
def test_extend_splits_into_ragged_new_tokens_and_the_paged_prefix(
    mode: str, prefix: list[int], expected: list[str]
) -> None:
    spec = SPECS["mqa"]  # full attention on both layers
    s = Setup(spec, prefix, [4, 1, 9], False, torch.float32)
    spy = SpyWrappers()
    s.run(FlashInferBackend(spec, s.kv, s.pool, wrappers=spy, ragged_prefill=mode), 0)
    assert [kind for kind, _ in spy.calls] == expected
    plans = {kind: kw for kind, kw in spy.calls if kind.endswith("plan")}
    if "ragged.plan" in plans:
        qo, kv = plans["ragged.plan"]["args"][:2]  # type: ignore[index]
        assert qo.tolist() == kv.tolist() == [0, 4, 5, 14]  # type: ignore[attr-defined]
        assert plans["ragged.plan"]["causal"] is True
    if "paged.plan" not in plans:
        return
    paged = plans["paged.plan"]
    qo, kv, indices = paged["args"][:3]  # type: ignore[index]
    assert qo.tolist() == [0, 4, 5, 14]  # type: ignore[attr-defined]
    if "merge" in expected:  # the prefix alone, every key of it visible to every query
        assert paged["causal"] is False
        assert kv.tolist() == [0, 3, 13, 13]  # type: ignore[attr-defined]
        cached = [s.pool.req_to_token[r, :p].tolist() for r, p in zip(s.rows, prefix, strict=True)]
        assert indices.tolist() == sum(cached, [])  # type: ignore[attr-defined]
    else:  # the whole sequence, causal
        assert paged["causal"] is True
        whole = [p + e for p, e in zip(prefix, [4, 1, 9], strict=True)]
        assert kv.tolist() == [0, *itertools.accumulate(whole)]  # type: ignore[attr-defined]


def test_ragged_prefill_takes_a_known_mode() -> None:
    s = Setup(SPECS["mqa"], [0], [4], False, torch.float32)
    with pytest.raises(ValueError, match="ragged_prefill"):
        FlashInferBackend(
            SPECS["mqa"], s.kv, s.pool, wrappers=ReferenceWrappers(), ragged_prefill="on"
        )


def test_windowed_layers_keep_one_causal_paged_pass() -> None:
    spec = SPECS["gqa2"]  # layer 0 full, layer 1 windowed
    s = Setup(spec, [3, 10, 0], [4, 1, 9], False, torch.float32)
    spy = SpyWrappers()
    s.run(FlashInferBackend(spec, s.kv, s.pool, wrappers=spy, ragged_prefill="split"), 1)
    causal = [kw for kind, kw in spy.calls if kind == "paged.plan" and kw["causal"]]
    assert len(causal) == 1 and causal[0]["window_left"] == WINDOW - 1
    assert causal[0]["args"][1].tolist() == [0, 7, 18, 27]  # type: ignore[index]
    assert [kind for kind, _ in spy.calls][-1] == "paged.run"  # the layer ran one paged pass


@pytest.mark.parametrize("fast", [True, False], ids=["fast_plan", "full_plan"])
def test_graph_decode_plan_fills_the_graph_buffers(fast: bool) -> None:
    """A CUDA graph's decode wrappers read their page table from fixed buffers. The first plan
    of a size is the full one; later ones (``fast_graph_plan``) write the buffers here and call
    the fast plan, which copies nothing. Either way each step attends as the eager backend does,
    a shorter batch after a longer one included (stale entries past its end)."""
    spec = SPECS["gqa2"]  # layer 1 has a window: two wrappers per size share the buffers
    prefix, extend = _lengths(BATCHES["prefix"], True)
    s = Setup(spec, prefix, extend, True, torch.float32)
    spy = SpyWrappers()
    backend = FlashInferBackend(spec, s.kv, s.pool, wrappers=spy, fast_graph_plan=fast)
    backend.init_cuda_graphs([1, 3], max_context_len=s.pool.req_to_token.shape[1])
    native = TorchNativeBackend(spec, s.kv, s.pool)
    for step, shrink in enumerate((0, 0, 6, 2)):
        seq = [max(1, n - shrink) for n in s.seq_lens]
        rows = zip(s.rows, seq, strict=True)
        slots = torch.stack([s.pool.req_to_token[r, n - 1] for r, n in rows]).long()
        batch = ForwardBatch.decode([0] * 3, s.rows, seq, slots, "cpu")
        spy.calls.clear()
        backend.init_graph_metadata(batch)
        planned = "fast_plan" if fast and step > 0 else "graph.plan"
        assert [kind for kind, _ in spy.calls] == [planned] * 2  # one per window
        if planned == "fast_plan":  # what FlashInfer's full plan would have set
            assert all(kw["max_kv_len"] == max(seq) for _, kw in spy.calls)
        native.init_forward_metadata(batch)
        for layer in range(2):
            out = backend.forward_decode(s.q, s.k, s.v, layer, batch)
            ref = native.forward_decode(s.q, s.k, s.v, layer, batch)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_lse_is_base_2_and_merges_split_keys(causal: bool) -> None:
    """The reference's log-sum-exp is FlashInfer's (base 2), and ``merge_state_reference`` of
    attention over two disjoint key sets is attention over their union."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, h, 16, generator=gen) for n, h in ((5, 4), (12, 2), (12, 2)))
    qo, ones = torch.tensor([0, 5]), torch.ones(1, dtype=torch.int32)

    def attend(keys: torch.Tensor, is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        out = paged_attention_reference(
            q,
            k.unsqueeze(1),
            v.unsqueeze(1),
            qo,
            torch.tensor([0, len(keys)]),
            keys,
            ones,
            causal=is_causal,
            sm_scale=0.25,
            return_lse=True,
        )
        assert isinstance(out, tuple)
        return out

    whole, lse = attend(torch.arange(12), causal)
    logits = torch.einsum("qhd,khd->qhk", q, k.repeat_interleave(2, dim=1)) * 0.25
    if causal:  # query i sits at 12 - 5 + i
        logits = logits.masked_fill(
            torch.arange(12) > torch.arange(7, 12)[:, None, None], -torch.inf
        )
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1) / math.log(2))
    # the first 7 keys precede every query: a non-causal pass; the last 5 as the whole was
    head, s_head = attend(torch.arange(7), False)
    tail_q = paged_attention_reference(
        q,
        k[7:].unsqueeze(1),
        v[7:].unsqueeze(1),
        qo,
        torch.tensor([0, 5]),
        torch.arange(5),
        ones,
        causal=causal,
        sm_scale=0.25,
        return_lse=True,
    )
    merged, s_merged = merge_state_reference(*tail_q, head, s_head)  # type: ignore[misc]
    torch.testing.assert_close(merged, whole)
    torch.testing.assert_close(s_merged, lse)
    empty, s_empty = attend(torch.arange(0), False)  # no keys: zeros and -inf, a no-op to merge
    assert not empty.any() and bool(torch.isneginf(s_empty).all())
    again, s_again = merge_state_reference(whole, lse, empty, s_empty)
    torch.testing.assert_close(again, whole)
    torch.testing.assert_close(s_again, lse)


def test_build_paged_kv_metadata_is_the_hand_written_csr() -> None:
    for decode in (False, True):
        s = Setup(
            SPECS["gqa2"], [3, 10, 0], [4, 1, 9] if not decode else [1, 1, 1], decode, torch.float32
        )
        b = s.batch
        md = build_paged_kv_metadata(
            s.pool.req_to_token,
            b.req_pool_indices,
            b.seq_lens,
            b.seq_lens_list,
            None if decode else b.extend_seq_lens_list,
        )
        qo, kv, indices = s.hand_metadata()
        assert (
            md.qo_indptr.tolist() == qo
            and md.kv_indptr.tolist() == kv
            and md.kv_indices.tolist() == indices
        )
        assert md.kv_last_page_len.tolist() == [1, 1, 1]
        assert {
            t.dtype for t in (md.qo_indptr, md.kv_indptr, md.kv_indices, md.kv_last_page_len)
        } == {torch.int32}
        # what FlashInfer's plan copies to the host anyway is built there: no sync per step
        assert {t.device.type for t in (md.qo_indptr, md.kv_indptr, md.kv_last_page_len)} == {"cpu"}


def test_bfloat16_matches_float32_reference() -> None:
    spec = SPECS["gqa3"]
    s = Setup(spec, [3, 10, 0], [4, 1, 9], False, torch.bfloat16)
    out = s.run(TorchNativeBackend(spec, s.kv, s.pool), 1)
    torch.testing.assert_close(out.float(), s.reference(1).float(), rtol=2e-2, atol=2e-2)


def test_registry(tmp_path: object) -> None:
    spec = SPECS["gqa2"]
    kv = KVCache(2, 16, 2, 32)
    pool = ReqToTokenPool(2, 8)
    assert default_backend_name(torch.device("cpu")) == "torch_native"
    assert default_backend_name(torch.device("cpu"), usable_cpu_kernel=True) == "cpu_kernel"
    assert default_backend_name(torch.device("cuda")) == "flashinfer"
    assert isinstance(create_attention_backend(None, spec, kv, pool), TorchNativeBackend)
    only = create_attention_backend(None, spec, kv, pool, TORCH_ONLY)
    assert isinstance(only, TorchNativeBackend)
    with pytest.raises(ValueError, match="cannot run"):
        create_attention_backend("cpu_kernel", spec, kv, pool, TORCH_ONLY)
    with pytest.raises(ValueError, match="unknown attention backend"):
        create_attention_backend("xformers", spec, kv, pool)
    kernels = CpuKernels.build()
    if kernels.attention:  # the default CPU backend is the kernel where it can run
        chosen = create_attention_backend(None, spec, kv, pool, kernels)
        assert isinstance(chosen, CpuKernelBackend)
        off = CpuKernels.build(attention=False)  # disable_cpu_attention_kernel
        assert isinstance(create_attention_backend(None, spec, kv, pool, off), TorchNativeBackend)


def test_decode_tensor_cores_follow_the_group_or_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA cores for GQA groups of 1, 2, 4 and 8 unless the config says otherwise, and the
    config's word reaches the wrappers through the registry (``ModelRunner``'s path)."""
    groups = {1: (8, 8), 2: (8, 4), 3: (6, 2), 4: (8, 2), 7: (14, 2), 8: (8, 1)}
    for group, (heads, kv_heads) in groups.items():
        spec = AttentionSpec(heads, kv_heads, 64, 0.125, (None,))
        assert decode_on_tensor_cores(spec) == (group not in (1, 2, 4, 8))
        assert decode_on_tensor_cores(spec, True) and not decode_on_tensor_cores(spec, False)
    made: list[bool | None] = []

    class Recording(ReferenceWrappers):
        def __init__(self, spec: AttentionSpec, device: torch.device, cores: bool | None) -> None:
            made.append(cores)

    monkeypatch.setattr(flashinfer_backend, "FlashInferWrappers", Recording)
    kv, pool = KVCache(2, 16, 2, 32), ReqToTokenPool(2, 8)
    for cores in (None, True, False):
        create_attention_backend("flashinfer", SPECS["gqa2"], kv, pool, decode_tensor_cores=cores)
    assert made == [None, True, False]


def test_cpu_path_never_imports_flashinfer() -> None:
    code = (
        "import sys, radixserve.models.attention.registry as r, radixserve.models.attention.flashinfer_backend, "
        "radixserve.runtime.model_runner; assert 'flashinfer' not in sys.modules, 'flashinfer imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _needs_flashinfer(device: str) -> None:
    if not device.startswith("cuda"):
        pytest.skip(
            "FlashInfer's kernels run on CUDA only (--device cpu: test_model_parity tests its wiring)"
        )
    pytest.importorskip("flashinfer")


GPU_BATCHES = {
    "extend": ([0, 37, 300], [129, 1, 70]),
    "extend_no_prefix": ([0, 0], [129, 70]),  # ragged only: no paged pass, no merge
    "decode": ([128, 37, 369], [1, 1, 1]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("ragged", ["split", "off"], ids=["ragged", "paged"])
@pytest.mark.parametrize("batch_name", sorted(GPU_BATCHES))
def test_flashinfer_kernels_match_reference_on_gpu(
    batch_name: str, ragged: str, device: str
) -> None:
    _needs_flashinfer(device)
    # head_dim 64: the kernels the parity tests build (FlashInfer compiles one per head size)
    spec = AttentionSpec(8, 2, 64, 64**-0.5, (None, 64))
    prefix, extend = GPU_BATCHES[batch_name]
    decode = batch_name == "decode"
    for layer in range(2):
        s = Setup(spec, prefix, extend, decode, torch.bfloat16, device=device, num_slots=4096)
        out = s.run(FlashInferBackend(spec, s.kv, s.pool, ragged_prefill=ragged), layer)
        torch.testing.assert_close(
            out.float().cpu(), s.reference(layer).float(), rtol=2e-2, atol=2e-2
        )


@pytest.mark.gpu
def test_flashinfer_lse_and_merge_state_match_reference_on_gpu(device: str) -> None:
    """What the split extend rests on: FlashInfer's log-sum-exp is the reference's (base 2),
    a request with no keys gives -inf, and ``merge_state`` is ``merge_state_reference``."""
    _needs_flashinfer(device)
    from radixserve.models.attention.flashinfer_wrappers import FlashInferWrappers

    spec = AttentionSpec(8, 2, 64, 64**-0.5, (None,))
    wrappers = FlashInferWrappers(spec, torch.device(device))
    gen = torch.Generator().manual_seed(3)
    qo = torch.tensor([0, 40, 41, 100], dtype=torch.int32)
    q = torch.randn(100, 8, 64, generator=gen).bfloat16()
    k, v = (torch.randn(100, 2, 64, generator=gen).bfloat16() for _ in range(2))
    ragged = wrappers.ragged()
    ragged.plan(qo, qo, 8, 2, 64, causal=True, sm_scale=64**-0.5, q_data_type=torch.bfloat16)
    o, lse = ragged.run(q.to(device), k.to(device), v.to(device), return_lse=True)
    ref = ReferenceWrappers().ragged()
    ref.plan(qo, qo, 8, 2, 64, causal=True, sm_scale=64**-0.5)
    o_ref, lse_ref = ref.run(q, k, v, return_lse=True)
    torch.testing.assert_close(o.float().cpu(), o_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), lse_ref, rtol=1e-2, atol=2e-2)
    # a paged pass in which the second request has no keys at all
    paged = wrappers.prefill()
    kv_indptr = torch.tensor([0, 30, 30, 80], dtype=torch.int32)
    ones = torch.ones(3, dtype=torch.int32)
    indices = torch.arange(80, dtype=torch.int32)
    kc, vc = (torch.randn(80, 1, 2, 64, generator=gen).bfloat16() for _ in range(2))
    paged.plan(
        qo,
        kv_indptr,
        indices.to(device),
        ones,
        8,
        2,
        64,
        1,
        causal=False,
        sm_scale=64**-0.5,
        q_data_type=torch.bfloat16,
    )
    o2, lse2 = paged.run(q.to(device), (kc.to(device), vc.to(device)), return_lse=True)
    o2_ref, lse2_ref = paged_attention_reference(
        q, kc, vc, qo, kv_indptr, indices, ones, causal=False, sm_scale=64**-0.5, return_lse=True
    )
    torch.testing.assert_close(o2.float().cpu(), o2_ref.float(), rtol=2e-2, atol=2e-2)
    merged, s_merged = wrappers.merge_state(o, lse, o2, lse2)
    merged_ref, s_merged_ref = merge_state_reference(o_ref, lse_ref, o2_ref, lse2_ref)
    torch.testing.assert_close(merged.float().cpu(), merged_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(s_merged.cpu(), s_merged_ref, rtol=1e-2, atol=2e-2)
