"""Quantities as the command line spells them (argparse types shared by every sub-command)."""

from __future__ import annotations

import argparse
import re


def parse_size(text: str) -> int:
    """``8GB``, ``512MiB``, ``1.5G`` or plain bytes -> bytes (an argparse type): K, M, G, T are
    powers of 1000, KiB, MiB, GiB, TiB of 1024."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(?:([KMGT])(I?))?B?\s*", text.upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8GB, 512MiB)")
    number, prefix, binary = m.groups()
    factor = (1024 if binary else 1000) ** (" KMGT".index(prefix) if prefix else 0)
    size = int(float(number) * factor)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"a size must be > 0: {text!r}")
    return size
