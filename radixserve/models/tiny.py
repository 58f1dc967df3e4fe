"""Tiny random-weight checkpoints in Hugging Face format, with a real tokenizer beside them.

Used by the tests (parity with transformers), the server's embedded default model and the
benchmarks. Everything is made offline and deterministically:

- the tokenizer is a byte-level BPE trained with ``tokenizers`` on the Python standard library's
  own sources, with the ChatML special tokens and a ChatML chat template, saved as a
  ``PreTrainedTokenizerFast`` (``AutoTokenizer.from_pretrained`` loads it);
- the weights are written by transformers' ``save_pretrained`` from a seeded random init, with
  norm weights and biases randomised too (all-ones norms would hide a loading bug).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import torch

CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")


def corpus_texts(max_chars: int = 2_000_000) -> list[str]:
    """The first ``max_chars`` characters of the stdlib's top-level ``*.py`` files, sorted by name."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if not texts:
        raise RuntimeError("no Python standard library sources found to train the tokenizer on")
    return texts


def train_tokenizer(vocab_size: int = 2048) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML tokens and template (about a
    second; the same merges on every run of the same Python installation)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def write_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    *,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    tokenizer: Any = None,
    vocab_size: int | None = None,
    initializer_range: float = 0.2,
    eos_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>"),
    bos_token: str | None = None,
    init_device: str = "cpu",
    **config_overrides: Any,
) -> Path:
    """Write a tiny ``arch`` (llama | qwen2 | qwen3 | mistral) checkpoint and tokenizer to ``out_dir``.

    ``tokenizer`` (from :func:`train_tokenizer`) is reused when given, else one is trained.
    ``vocab_size`` defaults to the tokenizer's size. ``initializer_range`` 0.2 (transformers'
    default is 0.02) makes the random model decisive: distinct greedy tokens with clear logit
    gaps instead of repeating its input, which makes parity tests meaningful.
    ``eos_tokens``: every end-of-sequence token, the first the config's own (the generation
    config lists them all, as checkpoints do); the last is the pad token. ``bos_token``: the
    config's BOS, if the family has one. ``init_device``: where the random weights are drawn
    (``cuda`` makes an 8B model in seconds). ``config_overrides`` go to the transformers config
    (e.g. ``rope_scaling``, ``attention_bias``, ``sliding_window``). Returns ``out_dir``.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else train_tokenizer()
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in eos_tokens]
    bos_id = tokenizer.convert_tokens_to_ids(bos_token) if bos_token else None
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=eos_ids[0],
        bos_token_id=bos_id,
        pad_token_id=eos_ids[-1],
        initializer_range=initializer_range,
    )
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if tie_word_embeddings is not None:
        kwargs["tie_word_embeddings"] = tie_word_embeddings
    kwargs.update(config_overrides)
    config = _config_class(arch)(**kwargs)
    torch.manual_seed(seed)
    with torch.device(init_device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.05)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_ids, pad_token_id=eos_ids[-1]
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_qwen25_05b_shaped(
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    tokenizer: Any = None,
    init_device: str = "cpu",
) -> Path:
    """A random model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
    intermediate 4864, vocab 151936, tied embeddings), weights in ``dtype`` (~1 GB in bf16).

    The tokenizer is the small one (ids above its size exist only in the model's vocab)."""
    return write_tiny_model(
        out_dir,
        "qwen2",
        num_layers=24,
        hidden_size=896,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        dtype=dtype,
        seed=seed,
        tokenizer=tokenizer,
        vocab_size=151936,
        initializer_range=0.02,
        rope_theta=1000000.0,
        init_device=init_device,
    )


def write_llama3_8b_shaped(
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    tokenizer: Any = None,
    init_device: str = "cpu",
) -> Path:
    """A random model of Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads,
    intermediate 14336, vocab 128256, untied), ~16 GB in bf16: the GPU benchmarks' large
    model. The tokenizer is the small one, as in :func:`write_qwen25_05b_shaped`."""
    return write_tiny_model(
        out_dir,
        "llama",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        dtype=dtype,
        seed=seed,
        tokenizer=tokenizer,
        vocab_size=128256,
        initializer_range=0.02,
        rope_theta=500000.0,
        init_device=init_device,
    )


def _config_class(arch: str) -> Any:
    import transformers

    return {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
    }[arch]
