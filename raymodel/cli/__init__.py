"""The ``raymodel`` command: the registry (``models list|show|alias|delete``), serving
(``serve KEY@ALIAS --route /digits``), batch scoring (``predict KEY@ALIAS --input
data.parquet --output scores/``), the training server (``server start|stop|status``)
its jobs (``jobs list|show|logs|stop|wait``), jobs by reference (``train|tune KEY@ALIAS
--data pkg.module:OBJECT --register KEY@ALIAS``), the web ``dashboard``, and KubeRay's resources of
them (``k8s cluster|job|service``, docs/kubernetes.md) from a shell.
``raymodel --address http://HEAD:8265 COMMAND`` runs any of them from a machine that is not a node
of the cluster (docs/storage.md, "From a laptop").

The registry is ``RAYMODEL_REGISTRY`` (a folder or URI), else
``$RAYMODEL_HOME/registry``; ``--registry URI`` overrides both. Every error
ends in one line on stderr and a non-zero exit code, never a traceback
(``RAYMODEL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Any, Sequence

from raymodel._ray import remote
from raymodel.cli import _jobs, _k8s, _models, _release, _serving, _train_tune
from raymodel.exceptions import RayModelError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"] and argv[1:2] in (["rollout"], ["rollouts"]):  # `serve rollout ROUTE REF`
        argv = [f"serve-{argv[1]}", *argv[2:]]
    args = _parser().parse_args(argv)
    if args.cluster is not None:  # every command's `rm.init` then joins it (as RAY_ADDRESS would)
        os.environ["RAY_ADDRESS"] = args.cluster
    try:
        if _whole_there(args):
            return int(remote.call(_here, argv, on_event=_said))
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


def _whole_there(args: argparse.Namespace) -> bool:
    """Whether the command runs whole on the cluster, as one call from a client off it (one call, not
    one for each question it asks the training server): the ``jobs`` commands and ``server status``."""
    if args.group != "jobs" and (args.group, getattr(args, "command", None)) != ("server", "status"):
        return False
    return remote.active() is not None


def _here(argv: list[str]) -> int:
    """On the cluster (a call's driver): the command's handler, its output sent to the client line by line."""
    args = _parser().parse_args(argv)  # `--address` is the client's: here is the cluster already
    with contextlib.redirect_stdout(_Lines()):
        return int(args.handler(args) or 0)


class _Lines(io.TextIOBase):
    """Standard output that sends each line to the client as it is written (``remote.emit``)."""

    def __init__(self) -> None:
        self.buffer = ""

    def write(self, text: str) -> int:
        *lines, self.buffer = (self.buffer + text).split("\n")
        for line in lines:
            remote.emit(line)
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            remote.emit(self.buffer)
            self.buffer = ""


def _said(line: Any) -> None:
    print(line, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raymodel", description="raymodel command line")
    parser.add_argument(
        "--registry", help="registry folder or URI (default: RAYMODEL_REGISTRY or $RAYMODEL_HOME/registry)"
    )
    parser.add_argument(
        "--address",
        dest="cluster",
        metavar="URL",
        help="the cluster to use: http://HEAD:8265 (its dashboard) from a machine that is not one of its nodes, "
        "HEAD:6379 from one that is (default: RAY_ADDRESS, else the running raymodel server)",
    )
    sub = parser.add_subparsers(dest="group", required=True)
    _models.add_commands(sub)
    _serving.add_commands(sub)
    _jobs.add_commands(sub)
    _train_tune.add_commands(sub)
    _release.add_commands(sub)
    _k8s.add_commands(sub)
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
    if remote.active() is not None:  # off the cluster: the dashboard runs there, its URL is the head's
        from raymodel.web import dashboard

        print(f"raymodel dashboard: {dashboard(args.port)}\n  (it runs on the cluster's head, until the cluster ends)")
        return
    run(args.port, args.host)
