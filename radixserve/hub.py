"""Where a model lives: a local checkpoint directory as it is, or a Hugging Face hub id
(``ORG/NAME``) resolved through ``huggingface_hub``'s cache, as SGLang and vLLM do.

The cache honours ``HF_HOME`` / ``HF_HUB_CACHE``; with ``HF_HUB_OFFLINE=1`` only what is cached
is used, and online the files a server needs are downloaded first (huggingface_hub reads those
variables itself). ``revision`` picks a branch, tag or commit.
"""

from __future__ import annotations

import re
from pathlib import Path

# what loading a checkpoint reads: config, weights, tokenizer and template files
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(model: str) -> bool:
    """``model`` reads as ``ORG/NAME`` and names no local path."""
    return _REPO_ID.fullmatch(model) is not None and not Path(model).expanduser().exists()


def resolve_model(model: str, revision: str | None = None) -> str:
    """The local directory of ``model`` (a directory, or a hub id); ``ValueError`` that says
    why when it is neither, or the hub cannot give it."""
    path = Path(model).expanduser()
    if not is_hub_id(model):
        if revision is not None:
            raise ValueError(f"--revision needs a hub id; {model!r} is a local path")
        try:
            found = (path / "config.json").is_file()
        except OSError as exc:  # a name too long, say
            raise ValueError(f"not a model directory: {exc.strerror}") from None
        if not found:
            raise ValueError(f"{model}: not a model directory (no config.json)")
        return str(path.resolve())
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        local = snapshot_download(model, revision=revision, allow_patterns=CHECKPOINT_FILES)
    except LocalEntryNotFoundError:
        raise ValueError(
            f"{model}{'@' + revision if revision else ''} is not in the hub cache and cannot be "
            "downloaded (offline, HF_HUB_OFFLINE=1, or no network): download it first, or give "
            "a local directory"
        ) from None
    except (HfHubHTTPError, HFValidationError, OSError) as exc:
        raise ValueError(f"{model}: {exc}".splitlines()[0]) from None
    if not (Path(str(local)) / "config.json").is_file():
        raise ValueError(f"{model}: the hub snapshot has no config.json")
    return str(local)
