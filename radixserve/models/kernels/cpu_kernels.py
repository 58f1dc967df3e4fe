"""CpuKernels: one model's choice of CPU kernels, built once and handed to its layers.

The engine builds one :class:`CpuKernels` from its config (:meth:`CpuKernels.build`: the ISA
variant, whether the dense layers and the attention may use the kernels) and passes it to the
model and the attention backend at construction; nothing is process-wide. :data:`TORCH_ONLY`
(the default everywhere) is the null object: every call is the plain torch reference.

With a variant loaded, :meth:`linear` sends decode-shaped products (``M <= MAX_M`` rows) to the
skinny GEMM of ``gemv.cpp`` (fp32 or bf16 weights widened in registers, fp32 accumulation;
int8 weights times ``x`` quantized to int8, at batch 1 per block of 32 like llama.cpp's Q8_0,
with exact int32 products per block, and from two rows on per row as the int8 GEMMs do, with
exact int32 sums over all of K: :data:`TORCH_Q8` is that route's torch reference),
:meth:`rms_norm` to ``norm.cpp`` and :meth:`silu_mul`, :meth:`rotary` and :meth:`store_kv` (the
small per-layer operations around them) to ``pointwise.cpp``. Larger products are compute-bound: on CPUs
without native bf16, bf16 and int8 weights go to the packed GEMM of ``gemm.cpp`` from
``GEMM_BF16_MAX_M`` / ``GEMM_INT8_MAX_M`` rows on (bf16 weights widened in its packing, fp32
FMAs; int8 weights times ``x`` quantized per row, both as int16 pairs multiplied by VPMADDWD),
fp32 weights to torch's GEMM beyond ``MAX_M``; elsewhere torch's GEMM takes them all. With the
``amx`` variant (CPUs with AMX), bf16 weights go to torch's GEMM (oneDNN, on the AMX tiles) from
``AMX_BF16_MAX_M`` rows on, and int8 weights to ``amx_gemm.cpp`` from ``AMX_INT8_MAX_M``: int8
tiles (TDPBSSD) times ``x`` quantized per row, the weights read in place. With AVX-512 VNNI but
no AMX (``avx512_vnni``, ``avx512_bf16``), int8 weights go to ``gemm_q8.h`` from
``VNNI_INT8_MAX_M`` rows on: VPDPBUSD times ``x`` quantized per row, the weights read in place
too. The routing follows the variant, not the CPU: a lower variant forced
(``RADIXSERVE_CPU_ISA``) routes as a CPU of that variant would (torch's own GEMMs still use
what the CPU has).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType

import torch
import torch.nn.functional as F

from radixserve.memory_pool import KVCache
from radixserve.models.kernels import _ext
from radixserve.models.kernels.attention import AttentionKernel, attention_kernel
from radixserve.models.kernels.linear import Q8_ROW_MAX_K, q8_reference, torch_linear
from radixserve.models.kernels.pointwise import apply_rotary, silu_mul, split_rope

MAX_M = 128
"""Most rows of ``x`` sent to the skinny GEMM; beyond it the packed GEMM or torch's (see the
module docstring). Measured on the AVX2 host before the packed GEMM (0.5B shape, bf16, 2
threads, quiet): a 64-token prefill ran at 45 tok/s with 32 here (torch's fp32 GEMM, widening
every weight per call), 105 with 64 and 99 with 128; a 200-token prefill at 75 with 64 and 97
with 128. Batch-32 decode streams each weight once."""

AMX_BF16_MAX_M = 8
"""Most rows of ``x`` sent to the skinny GEMM with bf16 weights on a CPU with AMX-BF16 (Sapphire
Rapids and later), where torch's bf16 GEMM (oneDNN) runs on the AMX tiles. Measured on such a
CPU (2 pinned cores, 48 4864x896 bf16 weights, GB/s of weight read, two runs): the kernel 22 /
12.4 / 7.0 / 4.5 / 3.4 / 1.4 at M = 1 / 8 / 16 / 24 / 32 / 64, F.linear 9.6 / 9.2-9.6 / 11.0 /
10.1 / 8.3-9.1 / 6.2. With 16 here a 64-token prefill already ran at 1.6-3.5x HF there."""

AMX_INT8_MAX_M = 1
"""Most rows of ``x`` sent to the skinny GEMM with int8 weights in the ``amx`` variant; beyond it
the AMX int8 GEMM (``amx_gemm.cpp``). Measured on a Sapphire Rapids-class Xeon (2 threads, 96
cache-cold 4864x896 int8 weights, GB/s of int8 read, ``gemv_bench.py --int8``, median of 5): the
skinny GEMM (VNNI) 22.0 / 18.0 / 13.3 / 10.8 / 6.6 / 3.3 / 1.8 / 1.0 / 0.2 at M = 1 / 2 / 4 / 8 /
16 / 32 / 64 / 128 / 512, the AMX GEMM 21.5 / 21.7 / 21.3 / 21.5 / 21.3 / 15.7 / 12.7 / 9.3 /
3.2, torch's bf16 GEMM on the same weights in bf16 6.6 ... 2.1 (the same work). Batch 1 keeps
the skinny GEMM: as fast, and its x blocks of 32 are finer than one scale per row."""

AVX512_BF16_MAX_M = 48
"""The same on AVX512-BF16 CPUs without AMX (Zen 4, Cooper Lake), where torch's bf16 GEMM (oneDNN)
runs on VDPBF16PS. The skinny GEMM multiplies bf16 pairs there too (VDPBF16PS in 4 x 6 tiles,
prefetching their weight rows into L2). Measured on Zen 4 (2 threads, a layer's weights per
shape over huge pages, cache-cold as in decode, GB/s of weight, skinny / torch, median of 7):
Qwen3-1.7B M = 16: 16.4 / 10.4; 24: 12.5 / 8.5; 32: 9.0-9.2 / 7.0-7.2; 48: 6.2-6.3 / 5.6-5.7;
64: 4.7 / 4.8; Qwen2.5-0.5B M = 24: 9.1 / 5.7; 32: 7.1 / 5.2; 48: 4.9 / 4.2; 64: 3.8 / 3.7."""

GEMM_BF16_MAX_M = 24
"""Most rows of ``x`` sent to the skinny GEMM with bf16 weights where the packed GEMM takes the
taller products. Measured on the AVX2 host (2 threads, 0.5B-shape weights 9728x896, 896x4864,
1152x896, GFLOP/s skinny / packed): M = 16: 125-141 / 112-130; 32: 129-137 / 136-149; 64:
133-137 / 162-172; 128: 121-138 / 172-178."""

GEMM_INT8_MAX_M = 16
"""The same with int8 weights, which the packed GEMM multiplies as int16 pairs (VPMADDWD, twice
the multiply-adds of an FMA per instruction) times ``x`` quantized per row, as the skinny GEMM
does from two rows on (exact int32 sums, VPMADDUBSW + VPMADDWD). It was 40 while the packed
GEMM's tile ran one pair of k per trip; with two (gemm.h's ``kPairSteps``), measured on an
AVX2-only EPYC (2 threads; whole decode steps at context 512, the weights streamed from memory,
rounds side by side, ``kernel_ab.py --int8-max-m 16 40``, median tok/s at 40 against 16): the
0.5B shape at batch 24 0.93x (but the per-round ratios' median 1.03x, 0.92-1.26), 32 0.94x,
40 0.97x; the 1.7B shape at 24 0.95x (0.92-1.00). Below 17 rows the skinny GEMM keeps them, as
fast as the packed one with the weights hot (``gemm_bench.py --int8``: 131 / 137 GFLOP/s at 16
rows)."""

NATIVE_BF16_VARIANTS = frozenset({"avx512_bf16", "amx"})
"""Variants whose CPUs multiply bf16 natively (torch's bf16 GEMMs then need no fp32 detour)."""

PACKED_GEMM_VARIANTS = frozenset({"avx2"})
"""Variants whose packed GEMM is measured and used (on CPUs without native bf16); the others are
built and tested with it but keep torch's GEMM until measured on their CPUs."""

VNNI_INT8_MAX_M = 6
"""Most rows of ``x`` sent to the skinny GEMM with int8 weights where the AVX-512 VNNI int8 GEMM
(``gemm_q8.h``) takes the taller products. Measured on Zen 4 (2 threads, whole decode steps at
context 512, the weights streamed from memory, rounds side by side, this constant at 4 against
8, tok/s skinny / VNNI GEMM): the 1.7B shape at batch 5 1.12x, 6 1.07x, 7 0.97x, 8 0.98x; the
0.5B shape at 5 1.13x, 6 1.06x, 7 0.79x (against 6), 8 0.95x. One 0.5B layer, its weights hot
(``gemm_bench.py --int8``, GOP/s): the VNNI GEMM 549 / 565 / 655 / 665 at M = 16 / 32 / 128 /
512 (torch's bf16 GEMM on the same weights in bf16: 380 at M = 512)."""

INT8_ROW_GEMMS = {"amx": AMX_INT8_MAX_M, "vnni": VNNI_INT8_MAX_M, "packed": GEMM_INT8_MAX_M}
"""The int8 GEMMs, each quantizing ``x`` per row (``amx_gemm.cpp``, ``gemm_q8.h``, ``gemm.h``), by
the name the extension's ``int8_gemm()`` gives, with the most rows the skinny GEMM keeps before
them. The packed one serves only variants whose packed GEMM is measured
(``PACKED_GEMM_VARIANTS``)."""

INT8_GEMM_OF_VARIANT = {"amx": "amx", "avx512_bf16": "vnni", "avx512_vnni": "vnni"}
"""The int8 GEMM each variant's build has (the extension's ``int8_gemm()``); the rest: packed."""

MIN_TASK_BYTES = 64 * 1024
"""Weight bytes per thread task; a smaller product runs on one thread."""


@dataclass(frozen=True, slots=True, eq=False)
class CpuKernels:
    """Which CPU kernels a model uses. Immutable; see the module docstring."""

    module: ModuleType | None = None  # the extension of `variant`; None: torch paths only
    variant: str | None = None  # "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx", "neon"
    dense: bool = False  # linear layers, RMSNorm, SiLU-and-mul and RoPE through the kernels
    attention: bool = False  # the cpu_kernel attention backend may run
    gemm_in_fp32: bool = False  # large bf16 products run torch's GEMM in float32
    gemm: bool = False  # larger bf16/int8 products run gemm.cpp's packed GEMM, not torch's
    bf16_max_m: int = MAX_M  # most rows of x for the skinny GEMM with bf16 weights
    int8_max_m: int = MAX_M  # the same with int8 weights
    int8_rows: bool = False  # int8 products taller than int8_max_m: a GEMM of x per row
    q8_reference: bool = False  # torch only: int8 products see x as the kernels quantize it

    @classmethod
    def build(
        cls, isa: str | None = None, dense: bool = True, attention: bool = True
    ) -> CpuKernels:
        """The kernels of the best variant this CPU runs, at most ``isa`` (builds or loads the
        extension now; never raises for a missing compiler: the result then uses torch only).
        ``ValueError`` for an unknown ``isa``."""
        variant = _ext.best_variant(isa)
        module = _ext.load_variant(variant) if variant and (dense or attention) else None
        if module is None or variant is None:
            return TORCH_ONLY
        routing = cls.routing(variant, module.int8_gemm())
        return replace(routing, module=module, dense=dense, attention=attention)

    @classmethod
    def routing(cls, variant: str, int8_gemm: str | None = None) -> CpuKernels:
        """How ``variant``'s kernels route products (no module: the decision alone). A function
        of the variant, never of this CPU's other flags: a forced lower variant routes as a CPU
        of that variant would. ``int8_gemm`` is the extension's own word for its taller int8
        products (``"amx"``, ``"vnni"`` or ``"packed"``); by default, what the variant's build
        has."""
        amx = variant == "amx"
        native_bf16 = variant in NATIVE_BF16_VARIANTS
        gemm = not native_bf16 and variant in PACKED_GEMM_VARIANTS
        if int8_gemm is None:
            int8_gemm = INT8_GEMM_OF_VARIANT.get(variant, "packed")
        rows = int8_gemm in INT8_ROW_GEMMS and (int8_gemm != "packed" or gemm)
        bf16_max_m = MAX_M  # beyond: the packed GEMM, or torch's (native bf16, or fp32)
        if native_bf16:
            bf16_max_m = AMX_BF16_MAX_M if amx else AVX512_BF16_MAX_M
        elif gemm:
            bf16_max_m = GEMM_BF16_MAX_M
        return cls(
            variant=variant,
            gemm_in_fp32=not native_bf16,
            gemm=gemm,
            bf16_max_m=bf16_max_m,
            int8_max_m=INT8_ROW_GEMMS[int8_gemm] if rows else MAX_M,
            int8_rows=rows,
        )

    def linear(
        self,
        x: torch.Tensor,  # [..., in]
        weight: torch.Tensor,  # [out, in] fp32, bf16 or int8
        bias: torch.Tensor | None = None,  # [out], x's dtype
        scale: torch.Tensor | None = None,  # [out] fp32: int8 weights' per-channel scales
    ) -> torch.Tensor:  # [..., out] in x's dtype
        """``(x @ weight.T) * scale + bias``, through the skinny GEMM where it applies."""
        if self.module is not None and self.dense and x.is_cpu:
            if not torch.compiler.is_compiling():
                max_m, gemm = self._route(weight.dtype)
                y = self.module.try_linear(x, weight, scale, bias, max_m, MIN_TASK_BYTES, gemm)
                if y is not None:
                    return y
        if self.q8_reference and scale is not None:
            k = x.shape[-1]
            rows = x.numel() // max(1, k)
            skinny = rows <= self.int8_max_m
            if rows <= 1 or (skinny and k > Q8_ROW_MAX_K):  # the skinny GEMM's Q8 blocks
                return torch_linear(q8_reference(x), weight, bias, scale).to(x.dtype)
            if skinny or self.int8_rows:  # the skinny or an int8 GEMM: x per row
                return torch_linear(q8_reference(x, k), weight, bias, scale).to(x.dtype)
        return torch_linear(x, weight, bias, scale, fp32_compute=self.gemm_in_fp32)

    def _route(self, dtype: torch.dtype) -> tuple[int, bool]:
        """(most rows for the skinny GEMM, taller ones to the kernel's packed or AMX GEMM) for
        weights of ``dtype``."""
        if dtype == torch.bfloat16:
            return self.bf16_max_m, self.gemm
        if dtype == torch.int8:
            return self.int8_max_m, self.int8_rows
        return MAX_M, False

    def decoder_layer(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor | None,
        weights: list[torch.Tensor | None],  # layer.cpp: 2 norms, 4 x (w, scale, bias), q/k norms
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        heads: int,
        kv_heads: int,
        attention: tuple[object, ...],  # CpuKernelBackend.fused_args: KV, rows, lengths, scale
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A whole decoder layer in one kernel call (``layer.cpp``), bit for bit the per-op
        path; ``None`` where it does not apply (then the caller runs the per-op path)."""
        if not (self._pointwise(x) and self.attention):
            return None
        weight = weights[2]
        assert weight is not None
        max_m, gemm = self._route(weight.dtype)
        if x.shape[0] > max_m and not gemm:  # a linear would go to torch's GEMM
            return None
        done = self.module.try_decoder_layer(  # type: ignore[union-attr]
            x,
            residual,
            weights,
            eps,
            max_m,
            MIN_TASK_BYTES,
            gemm,
            cos,
            sin,
            heads,
            kv_heads,
            *attention,
        )
        return None if done is None else (done[0], done[1])

    def rms_norm(
        self,
        x: torch.Tensor,  # [..., dim]
        weight: torch.Tensor,  # [dim]
        eps: float,
        residual: torch.Tensor | None = None,  # like x
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(s) * weight, s)`` with ``s = x + residual`` (``s`` is ``x`` without one);
        fp32 math and one rounding, as ``F.rms_norm`` on CPU."""
        if self.module is not None and self.dense and x.is_cpu:
            if not torch.compiler.is_compiling():
                done = self.module.try_rms_norm(x, weight, residual, eps)
                if done is not None:
                    out, s = done
                    return out, s
        s = x if residual is None else x + residual
        return F.rms_norm(s, (weight.shape[0],), weight, eps), s

    def _pointwise(self, x: torch.Tensor) -> bool:
        """Whether the pointwise kernels may take ``x``."""
        return (
            self.module is not None
            and self.dense
            and x.is_cpu
            and not torch.compiler.is_compiling()
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``gate_up`` ``[num_tokens, 2 * inter]`` = ``[gate | up]``, with
        the roundings of the torch reference (``pointwise.silu_mul``)."""
        if self._pointwise(gate_up):
            out = self.module.try_silu_mul(gate_up)  # type: ignore[union-attr]
            if out is not None:
                return out
        return silu_mul(gate_up)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` ``[num_tokens, heads, head_dim]`` rotated by ``cos`` and the signed ``sin``
        (``[num_tokens, 1, head_dim]``), bit for bit as ``pointwise.apply_rotary``. The kernel
        rotates ``x`` in place and returns it; the caller must not read ``x`` afterwards."""
        if self._pointwise(x) and self.module.try_rotary_(x, cos, sin):  # type: ignore[union-attr]
            return x
        return apply_rotary(x, cos, sin)

    def split_rope(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        qk_norm: tuple[torch.Tensor, float] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of ``qkv``, q and k rotated, as ``pointwise.split_rope``. The kernel norms
        (``qk_norm``) and rotates q and k in place in ``qkv`` and returns views of it (one call):
        the rotation is bit for bit the reference's; the norms' fp32 sums run in another order
        than torch's, so a bf16 value at a rounding boundary may be one ulp off."""
        if self._pointwise(qkv):
            norm_w, eps = qk_norm if qk_norm is not None else (None, 0.0)
            done = self.module.try_split_rope_(qkv, heads, kv_heads, cos, sin, norm_w, eps)  # type: ignore[union-attr]
            if done is not None:
                q, k, v = done
                return q, k, v
        return split_rope(qkv, heads, kv_heads, cos, sin, qk_norm, self.rotary)

    def store_kv(
        self, kv_cache: KVCache, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """``kv_cache.set_kv(layer, slots, k, v)``, in one call where the kernel applies (KV of
        ``k``'s dtype, slots in range)."""
        if self.module is not None and self.attention and k.is_cpu:
            k_buf, v_buf = kv_cache.get_kv(layer)
            if self.module.try_store_kv(k_buf, v_buf, slots, k, v):
                return
        kv_cache.set_kv(layer, slots, k, v)

    def attention_kernel(self, dtype: torch.dtype, head_dim: int) -> AttentionKernel | None:
        """The paged attention kernel for KV of ``dtype`` and ``head_dim``, or ``None``."""
        if self.module is None or not self.attention:
            return None
        return attention_kernel(self.module, dtype, head_dim)


TORCH_ONLY = CpuKernels()
"""No kernels: every layer runs its torch reference path."""

TORCH_Q8 = CpuKernels(q8_reference=True)
"""No kernels, but the kernels' numerics in torch: int8 products of one row multiply ``x``
quantized per block of 32 (``q8_reference``), as the skinny GEMM does at batch 1; of 2 to
``int8_max_m`` rows (the skinny GEMM), and with ``int8_rows`` of any more (the packed, AMX and
VNNI GEMMs), ``x`` quantized per row (give it the ``int8_max_m`` and ``int8_rows`` of the
kernels it stands for: ``dataclasses.replace``). The reference of the kernels' int8 route in
tests."""
