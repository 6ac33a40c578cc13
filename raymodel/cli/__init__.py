"""The ``raymodel`` command: the registry (``models list|show|alias|delete``), serving
(``serve KEY@ALIAS --route /digits``), batch scoring (``predict KEY@ALIAS --input
data.parquet --output scores/``), the training server (``server start|stop|status``)
its jobs (``jobs list|show|logs|stop|wait``), jobs by reference (``train|tune KEY@ALIAS
--data pkg.module:OBJECT --register KEY@ALIAS``) and the web ``dashboard`` from a shell.

The registry is ``RAYMODEL_REGISTRY`` (a folder or URI), else
``$RAYMODEL_HOME/registry``; ``--registry URI`` overrides both. Every error
ends in one line on stderr and a non-zero exit code, never a traceback
(``RAYMODEL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from raymodel.cli import _jobs, _models, _release, _serving, _train_tune
from raymodel.exceptions import RayModelError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"] and argv[1:2] in (["rollout"], ["rollouts"]):  # `serve rollout ROUTE REF`
        argv = [f"serve-{argv[1]}", *argv[2:]]
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RayModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("RAYMODEL_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {exc} (set RAYMODEL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raymodel", description="raymodel command line")
    parser.add_argument(
        "--registry", help="registry folder or URI (default: RAYMODEL_REGISTRY or $RAYMODEL_HOME/registry)"
    )
    sub = parser.add_subparsers(dest="group", required=True)
    _models.add_commands(sub)
    _serving.add_commands(sub)
    _jobs.add_commands(sub)
    _train_tune.add_commands(sub)
    _release.add_commands(sub)
    dash = sub.add_parser(
        "dashboard",
        help="the web dashboard: jobs and their curves, trials, models, routes, "
        "resources (joins the running raymodel server's cluster)",
    )
    dash.add_argument("--port", type=int, default=8270)
    dash.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to bind (default 127.0.0.1; 0.0.0.0 exposes it to your network)",
    )
    dash.set_defaults(handler=_dashboard)
    return parser


def _dashboard(args: argparse.Namespace) -> None:
    from raymodel.web import run

    _jobs.attach()
    run(args.port, args.host)
