"""``radixserve`` command line: ``radixserve serve`` (and later ``radixserve bench``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixserve", description="SGLang-style LLM serving runtime"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="start the HTTP server")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        print(
            "radixserve serve: the HTTP server is not built yet (issue: Serving).", file=sys.stderr
        )
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
