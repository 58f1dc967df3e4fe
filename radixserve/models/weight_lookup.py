"""SGLang's ``get_weights_by_name``: one checkpoint tensor, by transformers' name, as the served
model holds it now (how an RL trainer checks that a weight update went through).

The tensor comes back in the checkpoint's shape, fp32 on the CPU: a part of a merged weight
(``q_proj`` of ``qkv_proj``, ``up_proj`` of ``gate_up_proj``), an int8 weight times its
per-row scales, the embedding for a tied ``lm_head``. Under tensor parallelism each rank holds
a slice, so the lookup is refused there.
"""

from __future__ import annotations

import torch

from radixserve.models.decoder import DecoderForCausalLM, our_name
from radixserve.models.layers import Linear


def weight_by_name(model: DecoderForCausalLM, hf_name: str) -> torch.Tensor:
    """The tensor the checkpoint names ``hf_name``, as ``model`` holds it (see the module);
    ``ValueError`` for a name it does not hold."""
    if model.tp.is_parallel:
        raise ValueError("weights are not looked up with tensor parallelism (tp_size > 1)")
    name, shard = our_name(hf_name)
    if hf_name != "lm_head.weight" and not hf_name.startswith("model."):
        raise ValueError(f"the model holds no weight named {hf_name!r}")
    if name == "lm_head" and model.head_int8 is not None:
        rows = model.head_int8.float() * model.head_scale[:, None]  # type: ignore[index]
        return rows[: model.vocab_rows].contiguous()
    if name == "lm_head" and model.lm_head is None:
        name = "embed_tokens"  # tied
    params = dict(model.named_parameters())
    if name not in params:
        raise ValueError(f"the model holds no weight named {hf_name!r}")
    weight = params[name].detach()
    if name.endswith(".weight") and weight.dtype == torch.int8:
        owner = model.get_submodule(name.removesuffix(".weight"))
        assert isinstance(owner, Linear) and owner.weight_scale is not None
        weight = weight.float() * owner.weight_scale[:, None]
    if name in ("embed_tokens", "lm_head"):
        weight = weight[: model.vocab_rows]  # without the rows that pad the vocabulary
    if shard is not None:
        sizes = model.merged_parts(name)
        weight = weight.narrow(0, sum(sizes[:shard]), sizes[shard])
    return weight.to("cpu", torch.float32).contiguous()
