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
    serve.add_argument(
        "refs",
        nargs="+",
        metavar="REF[=WEIGHT]",
        help="a registry version, or a split: `digits@production=0.9 digits@candidate=0.1`",
    )
    serve.add_argument("--route", default="/", help="URL path (default /)")
    serve.add_argument("--shadow", metavar="REF", help="a version that gets a copy of each request (never answers)")
    serve.add_argument("--shadow-fraction", type=float, default=1.0, help="the share of requests copied (default 1)")
    serve.add_argument(
        "--config-out",
        metavar="FILE",
        help="write the route as Ray Serve's config file (for `serve deploy FILE`, a RayService) instead of serving",
    )
    serve.add_argument("--host", help="the address to listen on (default 127.0.0.1; in a config file 0.0.0.0)")
    serve.add_argument("--port", type=int, help="HTTP port (default: RAYMODEL_SERVE_PORT, else 8000)")
    serve.add_argument("--replicas", default="1", help="a number, or 'auto'")
    serve.add_argument(
        "--api",
        choices=("raymodel", "openai"),
        default="raymodel",
        help="openai: a causal LM answers OpenAI's API under the route (/completions, /chat/completions, /models)",
    )
    serve.add_argument(
        "--api-keys",
        metavar="VAR_OR_FILE",
        help="the environment variable or file holding the route's keys (never keys themselves: a command "
        "line is seen by every user of the machine); requests need `Authorization: Bearer <key>`",
    )
    serve.add_argument("--max-models", type=int, default=3, help="versions (adapters) a replica holds at once")
    serve.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    serve.set_defaults(handler=_serve)
    rollout = sub.add_parser(
        "serve-rollout",
        prog="raymodel serve rollout",
        help="(`raymodel serve rollout ROUTE REF`) move a route's traffic to a candidate in steps, in the "
        "cluster; roll back at once on a breach, promote (move the route's alias) after the last step",
    )
    rollout.add_argument("route", help="a served route of registry versions, e.g. /digits")
    rollout.add_argument("ref", help="the candidate: KEY@ALIAS or KEY:VERSION of the route's key")
    add_rollout_options(rollout, "0.05,0.25,1", 60.0)
    rollout.add_argument("--wait", action="store_true", help="follow it to its end (it goes on without you)")
    rollout.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, else the running one)")
    rollout.set_defaults(handler=_rollout)
    listed = sub.add_parser(
        "serve-rollouts", prog="raymodel serve rollouts", help="(`raymodel serve rollouts`) the cluster's rollouts"
    )
    listed.add_argument("--address", help="a Ray cluster to join (default: RAY_ADDRESS, else the running one)")
    listed.set_defaults(handler=_rollouts)
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


def served_refs(words: list[str]) -> Any:
    """A reference (``digits@production``), or a split of ``REF=WEIGHT`` words."""
    if len(words) == 1 and "=" not in words[0]:
        return words[0]
    split: dict[str, float] = {}
    for word in words:
        ref, equals, weight = word.rpartition("=")
        if not equals or not ref:
            raise SettingsError(
                f"A split is `REF=WEIGHT ...` (`digits@production=0.9 digits@candidate=0.1`): `{word}` has no weight."
            )
        try:
            split[ref] = float(weight)
        except ValueError:
            raise SettingsError(f"`{word}`: the weight `{weight}` is not a number.") from None
    return split


def _serve(args: argparse.Namespace) -> None:
    from raymodel.serve import Servable, config  # Ray Serve: imported by the command that uses it

    replicas: Any = (
        "auto" if args.replicas == "auto" else int(args.replicas) if args.replicas.isdigit() else args.replicas
    )
    what = served_refs(args.refs)
    settings = {
        **({"host": args.host} if args.host is not None else {}),
        **({"port": args.port} if args.port is not None else {}),
        "num_replicas": replicas,
        "api": args.api,
        "api_keys": args.api_keys,
        "max_models_per_replica": args.max_models,
    }
    where = {"registry": args.registry, "shadow": args.shadow, "shadow_fraction": args.shadow_fraction}
    if args.config_out:
        config(what, args.route, settings=settings, path=args.config_out, **where)
        print(f"wrote {args.config_out}: `serve deploy {args.config_out}` serves {args.route} on a Ray cluster")
        return
    servable = Servable(what, args.route, settings={"host": "127.0.0.1", **settings}, **where)
    args.ref = " ".join(args.refs)
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


def add_rollout_options(cmd: argparse.ArgumentParser, steps: str, step_s: float) -> None:
    """A rollout's steps and its guard's limits, as ``serve rollout`` and ``release`` take them."""
    cmd.add_argument("--steps", default=steps, help=f"the candidate's shares (default {steps})")
    cmd.add_argument(
        "--step-s", type=float, default=step_s, help=f"the least seconds a step lasts (default {step_s:g})"
    )
    cmd.add_argument("--max-error-rate", type=float, default=0.01, help="the candidate's limit (default 0.01)")
    cmd.add_argument("--max-p99-ms", type=float, help="the candidate's p99 latency limit (default: none)")
    cmd.add_argument("--min-requests", type=int, default=100, help="a step's least requests (default 100)")


def rollout_steps(text: str) -> tuple[float, ...]:
    """``--steps 0.1,0.5,1`` as shares (whether they make a plan is the plan's check)."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SettingsError(f"--steps takes shares separated by commas, like 0.05,0.25,1 (got {text!r}).") from None


def _rollout(args: argparse.Namespace) -> int:
    from raymodel.serve import Guard, Rollout, rollout

    steps = rollout_steps(args.steps)
    guard = Guard(max_error_rate=args.max_error_rate, max_p99_ms=args.max_p99_ms, min_requests=args.min_requests)
    init(address=args.address)
    started: Rollout = rollout(args.route, args.ref, steps, args.step_s, guard)
    state = started.state()
    what = f"{state['route']} {state['baseline']} -> {state['candidate']}"
    print(f"{started.id}: {what} in steps {args.steps}", flush=True)
    if not args.wait:
        print("it runs in the cluster; follow it with `raymodel serve rollouts`", flush=True)
        return 0
    said = None
    while (state := started.state())["status"] == "running":
        if state["reason"] != said:
            said = state["reason"]
            print(f"  {said}", flush=True)
        time.sleep(0.5)
    print(f"{state['status']}: {state['reason']}", flush=True)
    return 0 if state["status"] == "promoted" else 1


def _rollouts(args: argparse.Namespace) -> None:
    from raymodel.serve import rollouts

    init(address=args.address)
    found = [r.state() for r in rollouts()]
    if not found:
        print("no rollouts")
        return
    for s in found:
        shares = ", ".join(f"{ref} {w:.0%}" for ref, w in s["split"].items())
        c = s["figures"]["candidate"]
        print(
            f"{s['id']}  {s['route']}  {s['baseline']} -> {s['candidate']}  {s['status']}  "
            f"step {s['step']}/{len(s['steps'])}  [{shares}]  candidate: {c['requests']} requests, "
            f"{c['errors']} failed, p99 {c['p99_ms']} ms"
        )
        print(f"    {s['reason']}")


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
