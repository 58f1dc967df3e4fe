"""The ``radixserve`` command (also ``python -m radixserve``): ``serve`` (:mod:`radixserve.launch.cli`),
``bench`` (:mod:`radixserve.bench.cli`) and ``sim`` (:mod:`radixserve.sim.cli`).

It sits on top of them all, so none of them imports another to be a sub-command.
"""

from __future__ import annotations

import argparse

from radixserve.bench import cli as bench_cli
from radixserve.launch import cli as serve_cli
from radixserve.sim import cli as sim_cli

_RUN = {"serve": serve_cli.run, "bench": bench_cli.run, "sim": sim_cli.run}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixserve", description="SGLang-style LLM serving runtime"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cli.add_serve_parser(sub)
    bench_cli.add_bench_parser(sub)
    sim_cli.add_sim_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _RUN[args.command](args)
