"""DecoderForCausalLM: one decoder for the Llama, Qwen2, Qwen3 and Mistral families.

The families differ only in flags of :class:`ModelConfig`: q/k/v (and o) biases, Qwen3's q/k
RMSNorm, tied embeddings, head_dim, RoPE scaling and sliding windows. Per layer the work is
three merged projections (qkv, gate_up, and the two outputs), two fused add+RMSNorms, one RoPE
over q and k together, and the attention backend call.

Weights use transformers' names; :meth:`DecoderForCausalLM.load_weights` maps q/k/v into the
merged ``qkv_proj`` and gate/up into ``gate_up_proj``.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    apply_rotary,
    empty_param,
)
from radixserve.models.model_config import ModelConfig

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
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        qkv_size = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj = Linear(hidden, qkv_size, cfg.qkv_bias, dtype, device, kernels)
        self.o_proj = Linear(cfg.q_size, hidden, cfg.o_bias, dtype, device, kernels)
        self.eps = eps
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, eps, dtype, device)
            # [heads + kv_heads, head_dim]: q_norm's weight per q head, then k_norm's per k head
            fused = torch.empty(
                cfg.num_heads + cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device
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
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        qk = qkv[:, : self.q_size + self.kv_size].view(
            t, self.num_heads + self.num_kv_heads, self.head_dim
        )
        if self.qk_norm:
            qk = F.rms_norm(qk, (self.head_dim,), None, self.eps) * self.qk_norm_weight
        qk = apply_rotary(qk, cos, sin)  # [num_tokens, heads + kv_heads, head_dim]
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        if batch.is_decode:
            o = backend.forward_decode(q, k, v, self.layer_id, batch)
        else:
            o = backend.forward_extend(q, k, v, self.layer_id, batch)
        return self.o_proj(o)  # o [num_tokens, heads * head_dim]


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
    ) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, dtype, device, kernels)
        self.self_attn = Attention(cfg, layer_id, dtype, device, kernels)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype, device, kernels)
        inter, bias = cfg.intermediate_size, cfg.mlp_bias
        self.mlp = SwiGLUMLP(hidden, inter, bias, dtype, device, kernels)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output (embeddings first)
        residual: torch.Tensor | None,  # [num_tokens, hidden]: the running residual sum
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, batch, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DecoderForCausalLM(nn.Module):
    """The model. ``forward`` returns final hidden states; ``compute_logits`` applies the lm_head
    to the rows the caller selects (so logits are computed only where they are needed).

    ``kernels`` (default: the torch reference) is the CPU kernel choice every layer uses.
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
    ) -> None:
        super().__init__()
        self.config = cfg
        self.kernels = kernels
        self.embed_tokens = empty_param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, device, kernels) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device, kernels)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else empty_param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        )
        self.register_buffer("head_int8", None)
        self.register_buffer("head_scale", None)
        positions = max_positions or cfg.max_position_embeddings
        self.rotary = RotaryEmbedding(cfg.head_dim, positions, cfg.rope, dtype, device)

    @property
    def attention_spec(self) -> AttentionSpec:
        c = self.config
        return AttentionSpec(
            c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim**-0.5, c.sliding_windows
        )

    def forward(self, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """Hidden states after the final norm, ``[num_tokens, hidden]``. The caller has called
        ``backend.init_forward_metadata(batch)``."""
        h = F.embedding(batch.input_ids, self.embed_tokens)  # [num_tokens, hidden]
        cos, sin = self.rotary.cos_sin(batch.positions)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, cos, sin, batch, backend)
        out, _ = self.norm(h, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[n, hidden]`` -> logits ``[n, vocab]`` in the model dtype."""
        if self.head_int8 is not None:
            return self.kernels.linear(hidden, self.head_int8, None, self.head_scale)
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.kernels.linear(hidden, weight)

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
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy transformers-named tensors into the parameters (converting dtype). Raises
        ``ValueError`` for a shape mismatch or a parameter that no tensor filled."""
        params = dict(self.named_parameters())
        cfg = self.config
        # row sizes of the parts of each merged weight, by a fragment of its name
        layout = {
            ".self_attn.qkv_proj.": (cfg.q_size, cfg.kv_size, cfg.kv_size),
            ".mlp.gate_up_proj.": (cfg.intermediate_size, cfg.intermediate_size),
        }

        def parts(name: str) -> tuple[int, ...]:
            return next((sizes for frag, sizes in layout.items() if frag in name), ())

        filled: set[str] = set()
        for hf_name, tensor in weights:
            name, shard = _our_name(hf_name)
            if name not in params:
                continue  # rotary inv_freq buffers, a tied lm_head written anyway, ...
            dst = params[name].data
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
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.finalize()


def _our_name(hf_name: str) -> tuple[str, int | None]:
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
