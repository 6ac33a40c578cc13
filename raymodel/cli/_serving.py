"""``raymodel serve REF`` and ``raymodel predict REF``: serving and batch scoring from a shell."""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

from raymodel._internal import storage, tmp
from raymodel.exceptions import SettingsError
from raymodel.jobs import init


def add_commands(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a registry version over HTTP until interrupted: KEY, KEY:VERSION "
        "or KEY@ALIAS (an alias is followed when it moves)",
    )
    serve.add_argument("ref")
    serve.add_argument("--route", default="/", help="URL path (default /)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--replicas", default="1", help="a number, or 'auto'")
    serve.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    serve.set_defaults(handler=_serve)
    predict = sub.add_parser(
        "predict",
        help="score Parquet/CSV files with a registry version (KEY, KEY:VERSION, "
        "KEY@ALIAS) or a checkpoint path, over Ray Data; write Parquet",
    )
    predict.add_argument("ref")
    predict.add_argument("--input", required=True, help="a Parquet or CSV file, or a folder of them (path or URI)")
    predict.add_argument("--output", required=True, help="a new folder (path or URI) for the Parquet output")
    predict.add_argument("--batch-size", type=int, default=1024)
    predict.add_argument("--concurrency", type=int, help="actors (default: as many as fit)")
    predict.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per actor (default 1)")
    predict.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="COLUMN",
        help="copy this input column to the output (repeat for more)",
    )
    predict.add_argument(
        "--address", help="a Ray cluster to join (default: RAY_ADDRESS, a running raymodel server, else a local Ray)"
    )
    predict.set_defaults(handler=_predict)


def _serve(args: argparse.Namespace) -> None:
    from raymodel.serve import Servable  # Ray Serve: imported by the command that uses it

    replicas: Any = (
        "auto" if args.replicas == "auto" else int(args.replicas) if args.replicas.isdigit() else args.replicas
    )
    servable = Servable(
        args.ref,
        args.route,
        registry=args.registry,
        settings={"host": args.host, "port": args.port, "num_replicas": replicas},
    )
    init(address=args.address)
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
    from raymodel.predict import predict_batch  # Ray Data, likewise

    if storage.listdir(args.output):
        raise SettingsError(f"`{args.output}` already exists and is not empty; choose a new --output.")
    began = time.monotonic()
    init(address=args.address)
    predictions = predict_batch(
        args.ref,
        args.input,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        num_cpus=args.num_cpus,
        keep_columns=args.keep,
        registry=args.registry,
    )
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
