"""The ``gpujob`` command: ``operator`` runs the controller; more subcommands join it."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpujob", description="gpujob: GPU training jobs on Kubernetes"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    op = sub.add_parser("operator", help="run the operator")
    from gpujob_operator.runtime import main as op_main

    op_main.add_arguments(op)
    from gpujob_operator.monitoring import diagnose

    diag = sub.add_parser("diagnose", help="scrape trainer endpoints; print progress and verdict")
    diagnose.add_arguments(diag)
    from gpujob_operator.runtime import profilecli

    prof = sub.add_parser(
        "profile", help="ask a running job for a profile (torch.profiler on its ranks)"
    )
    profilecli.add_arguments(prof)
    args = p.parse_args(argv)
    if args.cmd == "diagnose":
        return diagnose.run(args)
    if args.cmd == "profile":
        return profilecli.run(args)
    if args.cmd == "operator":
        op_main.run(
            args.namespace,
            args.liveness,
            args.verbose,
            args.metrics_port,
            args.metrics_addr,
            op_main.webhook_flags(args),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
