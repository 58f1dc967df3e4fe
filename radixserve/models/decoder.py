"""DecoderForCausalLM: one decoder for the Llama, Qwen2, Qwen3 and Mistral families.

The families differ only in flags of :class:`ModelConfig`: q/k/v (and o) biases, Qwen3's q/k
RMSNorm, tied embeddings, head_dim, RoPE scaling and sliding windows. Per layer the work is
three merged projections (qkv, gate_up, and the two outputs), two fused add+RMSNorms, one RoPE
over q and k together, and the attention backend call.

Under tensor parallelism (a :class:`TPGroup` of more than one rank, see ``parallel.py``) each
rank builds the same model with its share of the heads, the MLP columns and the vocabulary, and
:meth:`DecoderForCausalLM.load_weights` keeps only its slice of each checkpoint tensor.

Weights use transformers' names; :meth:`DecoderForCausalLM.load_weights` maps q/k/v into the
merged ``qkv_proj`` and gate/up into ``gate_up_proj``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.models.attention.base import AttentionBackend, AttentionSpec
from radixserve.models.kernels import TORCH_ONLY, CpuKernels, quantize_int8
from radixserve.models.layers import (
    Linear,
    RMSNorm,
    RotaryEmbedding,
    SwiGLUMLP,
    empty_param,
)
from radixserve.models.model_config import ModelConfig
from radixserve.models.parallel import SINGLE, TPGroup, check_tp_shapes

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch

# transformers name -> (our parameter name, shard index) for merged weights
_STACKED = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", 0),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", 1),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", 2),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
)


class Attention(nn.Module):
    qk_norm_weight: torch.Tensor  # a buffer, present when qk_norm

    def __init__(
        self,
        cfg: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.tp = tp
        self.kernels = kernels
        # this rank's heads: a share of the query heads and of the KV heads (or the one it reads)
        self.num_heads, self.head_dim = cfg.num_heads // tp.size, cfg.head_dim
        self.kv_head_start, self.num_kv_heads = tp.kv_heads(cfg.num_kv_heads)
        self.q_size, self.kv_size = self.num_heads * cfg.head_dim, self.num_kv_heads * cfg.head_dim
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_proj = Linear(hidden, qkv_size, cfg.qkv_bias, dtype, device, kernels)
        # row-parallel: the bias is added once, by rank 0, before the all-reduce
        o_bias = cfg.o_bias and tp.rank == 0
        self.o_proj = Linear(self.q_size, hidden, o_bias, dtype, device, kernels)
        self.eps = eps
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, eps, dtype, device)
            # [heads + kv_heads, head_dim]: q_norm's weight per q head, then k_norm's per k head
            fused = torch.empty(
                self.num_heads + self.num_kv_heads, cfg.head_dim, dtype=dtype, device=device
            )
            self.register_buffer("qk_norm_weight", fused, persistent=False)

    def finalize(self) -> None:
        """Derive the fused q/k norm weight from the loaded ``q_norm``/``k_norm`` weights."""
        if self.qk_norm:
            q_w = self.q_norm.weight.expand(self.num_heads, -1)
            k_w = self.k_norm.weight.expand(self.num_kv_heads, -1)
            self.qk_norm_weight.copy_(torch.cat([q_w, k_w]))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:  # x [num_tokens, hidden] -> [num_tokens, hidden]
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        lora = batch.lora
        if lora is not None:
            lora.add(self.layer_id, "qkv_proj", x, qkv, self.kernels)
        qk_norm = (self.qk_norm_weight, self.eps) if self.qk_norm else None
        q, k, v = self.kernels.split_rope(
            qkv, self.num_heads, self.num_kv_heads, cos, sin, qk_norm
        )  # q [num_tokens, heads, head_dim], k and v [num_tokens, kv_heads, head_dim]
        if batch.is_decode:
            o = backend.forward_decode(q, k, v, self.layer_id, batch)
        else:
            o = backend.forward_extend(q, k, v, self.layer_id, batch)
        out = self.o_proj(o)  # o [num_tokens, heads * head_dim]
        if lora is not None:
            lora.add(self.layer_id, "o_proj", o, out, self.kernels)
        return self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, dtype, device, kernels)
        self.self_attn = Attention(cfg, layer_id, dtype, device, kernels, tp)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype, device, kernels)
        inter, bias = cfg.intermediate_size // tp.size, cfg.mlp_bias
        self.mlp = SwiGLUMLP(hidden, inter, bias, dtype, device, kernels, tp)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output (embeddings first)
        residual: torch.Tensor | None,  # [num_tokens, hidden]: the running residual sum
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if batch.is_decode:
            fused = self._fused(x, residual, cos, sin, batch, backend)
            if fused is not None:
                return fused
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, batch, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h, batch.lora, self.self_attn.layer_id), residual

    def _fused(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This layer in one kernel call (``CpuKernels.decoder_layer``: Python leaves a decode
        step), bit for bit what the op-by-op path below computes; ``None`` where it does not
        apply (tensor parallel, another attention backend, torch's GEMM)."""
        attn, mlp = self.self_attn, self.mlp
        if batch.lora is not None or attn.tp.size > 1 or self.input_layernorm.eps != attn.eps:
            return None
        attention = backend.fused_args(attn.layer_id, batch)
        if attention is None:
            return None
        weights: list[torch.Tensor | None] = [
            self.input_layernorm.weight,
            self.post_attention_layernorm.weight,
        ]
        for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            weights += [linear.weight, linear.weight_scale, linear.bias]
        weights.append(attn.qk_norm_weight if attn.qk_norm else None)
        return attn.kernels.decoder_layer(
            x, residual, weights, attn.eps, cos, sin, attn.num_heads, attn.num_kv_heads, attention
        )


class DecoderForCausalLM(nn.Module):
    """The model. ``forward`` returns final hidden states; ``compute_logits`` applies the lm_head
    to the rows the caller selects (so logits are computed only where they are needed).

    ``kernels`` (default: the torch reference) is the CPU kernel choice every layer uses;
    ``tp`` the tensor-parallel rank this copy of the model is (default: the whole model).
    """

    head_int8: torch.Tensor | None  # buffers after quantize_int8: the lm_head in int8 [vocab,
    head_scale: torch.Tensor | None  # hidden] and its per-row fp32 scales [vocab]

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
        kernels: CpuKernels = TORCH_ONLY,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        check_tp_shapes(cfg, tp.size)
        self.config = cfg
        self.kernels = kernels
        self.tp = tp
        # this rank's rows of the embedding and the lm_head: [vocab_start, + vocab_rows), padded
        self.vocab_start, self.vocab_rows, rows = tp.vocab_shard(cfg.vocab_size)
        self.embed_tokens = empty_param(rows, cfg.hidden_size, dtype=dtype, device=device)
        if rows > self.vocab_rows:  # the padding rows past the vocabulary stay zero
            self.embed_tokens.data[self.vocab_rows :].zero_()
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, device, kernels, tp) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device, kernels)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else torch.nn.Parameter(torch.zeros_like(self.embed_tokens), requires_grad=False)
        )
        self.register_buffer("head_int8", None)
        self.register_buffer("head_scale", None)
        positions = max_positions or cfg.max_position_embeddings
        self.rotary = RotaryEmbedding(cfg.head_dim, positions, cfg.rope, dtype, device)

    @property
    def attention_spec(self) -> AttentionSpec:
        c, attn = self.config, self.layers[0].self_attn
        assert isinstance(attn, Attention)
        return AttentionSpec(
            attn.num_heads, attn.num_kv_heads, c.head_dim, c.head_dim**-0.5, c.sliding_windows
        )

    def forward(self, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """Hidden states after the final norm, ``[num_tokens, hidden]``. The caller has called
        ``backend.init_forward_metadata(batch)``."""
        h = self._embed(batch.input_ids)  # [num_tokens, hidden]
        cos, sin = self.rotary.cos_sin(batch.positions)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, cos, sin, batch, backend)
        out, _ = self.norm(h, residual)
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, hidden]
        if not self.tp.is_parallel:
            return F.embedding(ids, self.embed_tokens)
        # vocab-parallel: each rank looks up the ids in its rows, zeros elsewhere, then a sum
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_rows)
        h = F.embedding(local.masked_fill(outside, 0), self.embed_tokens)
        return self.tp.all_reduce(h.masked_fill_(outside[:, None], 0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[n, hidden]`` -> logits ``[n, vocab]`` in the model dtype (under tensor
        parallelism every rank computes its vocabulary columns and gathers all of them)."""
        if self.head_int8 is not None:
            logits = self.kernels.linear(hidden, self.head_int8, None, self.head_scale)
        else:
            weight = self.embed_tokens if self.lm_head is None else self.lm_head
            logits = self.kernels.linear(hidden, weight)
        if not self.tp.is_parallel:
            return logits
        return self.tp.all_gather(logits)[:, : self.config.vocab_size]

    def quantize_int8(self) -> None:
        """Weight-only int8 after loading: every projection and the lm_head (a tied embedding
        stays as it is for the lookup) become int8 with per-output-channel fp32 scales."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.quantize_int8()
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        self.head_int8, self.head_scale = quantize_int8(weight)
        self.lm_head = None

    # ---- weights -------------------------------------------------------------------------
    def merged_parts(self, name: str) -> tuple[int, ...]:
        """Row counts of the checkpoint tensors merged into parameter ``name`` on this rank
        (q, k, v; gate, up), or () for a parameter that is one tensor."""
        attn = self.layers[0].self_attn
        assert isinstance(attn, Attention)
        if ".self_attn.qkv_proj." in name:
            return attn.q_size, attn.kv_size, attn.kv_size
        if ".mlp.gate_up_proj." in name:
            return (self.config.intermediate_size // self.tp.size,) * 2
        return ()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy transformers-named tensors into the parameters (converting dtype), each rank
        its slice of them. Raises ``ValueError`` for a shape mismatch or a parameter that no
        tensor filled."""
        params = dict(self.named_parameters())
        attn = self.layers[0].self_attn
        assert isinstance(attn, Attention)
        slicer = _TPSlicer(self.config, self.tp, attn.kv_head_start)
        parts = self.merged_parts
        filled: set[str] = set()
        for hf_name, tensor in weights:
            name, shard = our_name(hf_name)
            if name not in params:
                continue  # rotary inv_freq buffers, a tied lm_head written anyway, ...
            dst = params[name].data
            tensor = slicer.slice(name, shard, tensor)
            if name in ("embed_tokens", "lm_head"):
                dst = dst.narrow(0, 0, self.vocab_rows)  # the padding rows stay zero
            if shard is not None:
                sizes = parts(name)
                dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
                name = f"{name}#{shard}"
            if tuple(dst.shape) != tuple(tensor.shape):
                shapes = f"{tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                raise ValueError(f"weight {hf_name!r} has shape {shapes}")
            dst.copy_(tensor)
            filled.add(name)
        expected = {f"{n}#{i}" for n in params for i in range(len(parts(n)))}
        expected |= {n for n in params if not parts(n)}
        missing = sorted(expected - filled)
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")
        self.finalize()

    def finalize(self) -> None:
        """Derive what each layer computes from its loaded weights (the fused q/k norm)."""
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.finalize()


@dataclass(frozen=True, slots=True)
class _TPSlicer:
    """Which slice of a whole checkpoint tensor one tensor-parallel rank keeps."""

    cfg: ModelConfig
    tp: TPGroup
    kv_head_start: int

    def slice(self, name: str, shard: int | None, tensor: torch.Tensor) -> torch.Tensor:
        """A view of ``tensor`` (our parameter ``name``, part ``shard`` of a merged weight)."""
        tp, cfg = self.tp, self.cfg
        if not tp.is_parallel:
            return tensor
        if name in ("embed_tokens", "lm_head"):
            start, rows, _ = tp.vocab_shard(cfg.vocab_size)
            return tensor.narrow(0, start, rows)
        if ".qkv_proj." in name:
            q_start, q_count = tp.split(cfg.q_size)
            if shard == 0:
                return tensor.narrow(0, q_start, q_count)
            _, kv_heads = tp.kv_heads(cfg.num_kv_heads)
            d = cfg.head_dim
            return tensor.narrow(0, self.kv_head_start * d, kv_heads * d)
        if ".gate_up_proj." in name:
            return tensor.narrow(0, *tp.split(cfg.intermediate_size))
        if name.endswith(".o_proj.weight"):  # row-parallel: the input columns
            return tensor.narrow(1, *tp.split(cfg.q_size))
        if name.endswith(".down_proj.weight"):
            return tensor.narrow(1, *tp.split(cfg.intermediate_size))
        return tensor  # norms (and row-parallel biases, which only rank 0 holds): whole


def our_name(hf_name: str) -> tuple[str, int | None]:
    """transformers' parameter name -> (our parameter name, shard index of a merged weight)."""
    if hf_name == "lm_head.weight":
        return "lm_head", None
    if not hf_name.startswith("model."):
        return hf_name, None  # not ours: skipped
    name = hf_name[len("model.") :]
    if name == "embed_tokens.weight":
        return "embed_tokens", None
    for theirs, ours, shard in _STACKED:
        if theirs in name:
            return name.replace(theirs, ours), shard
    return name, None
