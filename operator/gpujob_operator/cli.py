"""The ``gpujob`` command: ``operator`` runs the controller; more subcommands join it."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpujob", description="gpujob: GPU training jobs on Kubernetes")
    sub = p.add_subparsers(dest="cmd", required=True)
    op = sub.add_parser("operator", help="run the operator")
    from gpujob_operator import main as op_main

    op_main.add_arguments(op)
    args = p.parse_args(argv)
    if args.cmd == "operator":
        op_main.run(args.namespace, args.liveness, args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
