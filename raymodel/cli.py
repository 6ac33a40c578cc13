"""The ``raymodel`` command: the registry (``models list|show|alias|delete``), serving
(``serve KEY@ALIAS --route /digits``), batch scoring (``predict KEY@ALIAS --input
data.parquet --output scores/``), the training server (``server start|stop|status``)
its jobs (``jobs list|show|logs|stop|wait``) and the web ``dashboard`` from a shell.

The registry is ``RAYMODEL_REGISTRY`` (a folder or URI), else
``$RAYMODEL_HOME/registry``; ``--registry URI`` overrides both. Every error
ends in one line on stderr and a non-zero exit code, never a traceback
(``RAYMODEL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from raymodel.exceptions import RayModelError


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RayModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns any failure into one line
        if os.environ.get("RAYMODEL_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {exc} (set RAYMODEL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raymodel", description="raymodel command line")
    parser.add_argument("--registry", help="registry folder or URI (default: RAYMODEL_REGISTRY or "
                                           "$RAYMODEL_HOME/registry)")
    sub = parser.add_subparsers(dest="group", required=True)
    models = sub.add_parser("models", help="the model registry").add_subparsers(dest="command", required=True)
    ls = models.add_parser("list", help="list versions (of KEY)")
    ls.add_argument("key", nargs="?")
    ls.set_defaults(handler=_list)
    show = models.add_parser("show", help="show one version: KEY, KEY:VERSION or KEY@ALIAS")
    show.add_argument("ref")
    show.set_defaults(handler=_show)
    alias = models.add_parser("alias", help="point ALIAS at VERSION of KEY")
    alias.add_argument("key")
    alias.add_argument("version")
    alias.add_argument("alias")
    alias.set_defaults(handler=_alias)
    delete = models.add_parser("delete", help="delete VERSION of KEY")
    delete.add_argument("key")
    delete.add_argument("version")
    delete.set_defaults(handler=_delete)
    serve = sub.add_parser("serve", help="serve a registry version over HTTP until interrupted: KEY, KEY:VERSION "
                                         "or KEY@ALIAS (an alias is followed when it moves)")
    serve.add_argument("ref")
    serve.add_argument("--route", default="/", help="URL path (default /)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--replicas", default="1", help="a number, or 'auto'")
    serve.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    serve.set_defaults(handler=_serve)
    predict = sub.add_parser("predict", help="score Parquet/CSV files with a registry version (KEY, KEY:VERSION, "
                                             "KEY@ALIAS) or a checkpoint path, over Ray Data; write Parquet")
    predict.add_argument("ref")
    predict.add_argument("--input", required=True, help="a Parquet or CSV file, or a folder of them (path or URI)")
    predict.add_argument("--output", required=True, help="a new folder (path or URI) for the Parquet output")
    predict.add_argument("--batch-size", type=int, default=1024)
    predict.add_argument("--concurrency", type=int, help="actors (default: as many as fit)")
    predict.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per actor (default 1)")
    predict.add_argument("--keep", action="append", default=[], metavar="COLUMN",
                         help="copy this input column to the output (repeat for more)")
    predict.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, a running raymodel "
                                           "server, else a local Ray)")
    predict.set_defaults(handler=_predict)
    from raymodel.jobs._cli import add_commands

    add_commands(sub)
    dash = sub.add_parser("dashboard", help="the web dashboard: jobs and their curves, trials, models, routes, "
                                            "resources (joins the running raymodel server's cluster)")
    dash.add_argument("--port", type=int, default=8270)
    dash.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1; 0.0.0.0 "
                                                          "exposes it to your network)")
    dash.set_defaults(handler=_dashboard)
    return parser


def _dashboard(args: argparse.Namespace) -> None:
    from raymodel.web import run
    from raymodel.jobs._cli import attach

    attach()
    run(args.port, args.host)


def _registry(args: argparse.Namespace) -> Any:
    from raymodel import registry

    return registry.open(args.registry)


def _list(args: argparse.Namespace) -> None:
    reg = _registry(args)
    records = reg.list(args.key)
    if not records:
        print(f"(no models in {reg.uri})")
        return
    rows = [["KEY", "VERSION", "ALIASES", "CREATED", "METRICS"]]
    for r in records:
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r.metrics.items() if k != "epoch")
        rows.append([r.key, str(r.version), ",".join(r.aliases) or "-", r.created_iso, metrics or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])


def _show(args: argparse.Namespace) -> None:
    from raymodel._internal.names import parse_ref

    key, version = parse_ref(args.ref)
    r = _registry(args).show(key, version)
    print(json.dumps({"key": r.key, "version": r.version, "aliases": r.aliases, "created": r.created_iso,
                      "class": r.model_class, "backend": r.backend, "metrics": r.metrics,
                      "metadata": r.metadata, "lineage": r.lineage}, indent=2, default=str))


def _alias(args: argparse.Namespace) -> None:
    from raymodel._internal import names

    version = names.version(args.version)
    _registry(args).set_alias(args.key, args.alias, version)  # type: ignore[arg-type]
    print(f"{args.key}@{args.alias} -> version {version}")


def _delete(args: argparse.Namespace) -> None:
    from raymodel._internal import names

    version = names.version(args.version)
    _registry(args).delete(args.key, version)  # type: ignore[arg-type]
    print(f"deleted {args.key}:{version}")


def _serve(args: argparse.Namespace) -> None:
    import signal
    import time

    import raymodel as rm
    from raymodel.serve import Servable

    replicas: Any = "auto" if args.replicas == "auto" else int(args.replicas) if args.replicas.isdigit() else args.replicas
    servable = Servable(args.ref, args.route, registry=args.registry,
                        settings={"host": args.host, "port": args.port, "num_replicas": replicas})
    rm.init(address=args.address)
    signal.signal(signal.SIGTERM, _interrupt)  # after Ray's own handler: `kill` stops serving like Ctrl-C
    app = None
    try:
        app = servable.deploy()
        print(f"serving {args.ref} at {app.url} (Ctrl-C to stop)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        if app is not None:
            app.shutdown()
        print(f"stopped serving {args.ref}", flush=True)


def _predict(args: argparse.Namespace) -> None:
    import time

    import raymodel as rm
    from raymodel._internal import storage, tmp
    from raymodel.exceptions import SettingsError

    if storage.listdir(args.output):
        raise SettingsError(f"`{args.output}` already exists and is not empty; choose a new --output.")
    began = time.monotonic()
    rm.init(address=args.address)
    predictions = rm.predict_batch(args.ref, args.input, batch_size=args.batch_size, concurrency=args.concurrency,
                                   num_cpus=args.num_cpus, keep_columns=args.keep, registry=args.registry)
    if storage.is_uri(args.output):  # an object store has no rename: files appear as they are written
        predictions.write_parquet(args.output)
    else:  # written beside the target and renamed into place: no half-written output is ever visible
        with tmp.replacing(storage.local_path(args.output).resolve(), ".raymodel-predict") as staging:
            predictions.write_parquet(str(staging))
    import pyarrow.dataset

    fs, path = storage.filesystem(args.output)
    rows = pyarrow.dataset.dataset(path, filesystem=fs, format="parquet").count_rows()  # from the files' footers
    print(f"wrote {rows} predictions of {args.ref} to {args.output} in {time.monotonic() - began:.1f} s")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
