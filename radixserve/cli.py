"""The ``radixserve`` command (also ``python -m radixserve``): ``serve`` (:mod:`radixserve.launch.cli`),
``bench`` (:mod:`radixserve.bench.cli`) and ``sim`` (:mod:`radixserve.sim.cli`).

It sits on top of them all, so none of them imports another to be a sub-command. It imports only
the module of the sub-command it runs: ``bench`` and ``sim`` import torch, and ``serve`` starts
its scheduler before this process needs torch (a second sooner on a small host).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

# sub-command -> its module, which has ``add_<name>_parser(sub)`` and ``run(args)``
_COMMANDS = {
    "serve": "radixserve.launch.cli",
    "bench": "radixserve.bench.cli",
    "sim": "radixserve.sim.cli",
}


def _module(command: str) -> ModuleType:
    return importlib.import_module(_COMMANDS[command])


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every sub-command with its flags; with ``command``, only that one's flags (the others
    are named, their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="radixserve", description="SGLang-style LLM serving runtime"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMANDS:
        if command in (None, name):
            getattr(_module(name), f"add_{name}_parser")(sub)
        else:
            sub.add_parser(name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in _COMMANDS else None
    args = build_parser(command).parse_args(argv)
    return int(_module(args.command).run(args))
