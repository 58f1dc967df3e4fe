"""How ``serve``'s flag modules build their config part: a flag's dest is its field's name
(``--max-lora-rank`` -> ``max_lora_rank``), so a new field of a part needs one flag line and no
mapping. A flag whose value needs more than its dest (a path to check, a negated switch) is the
part's override."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Part = TypeVar("Part", bound=DataclassInstance)
else:
    Part = TypeVar("Part")


def part_from_args(kind: type[Part], args: argparse.Namespace, **overrides: Any) -> Part:
    """A ``kind`` of every field ``args`` holds by the field's name (a field with no flag keeps
    its default), ``overrides`` replacing them; the part checks itself (``ValueError``)."""
    given = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(kind) if hasattr(args, f.name)
    }
    return kind(**{**given, **overrides})
