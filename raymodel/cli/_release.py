"""``raymodel release REF --data MODULE:OBJECT --register KEY[@ALIAS] --gate METRIC [--against REF] [--route
ROUTE --steps ...] [--wait]``: a release (``model.release``) of a registry version trained further."""

from __future__ import annotations

import argparse
from typing import Any

from raymodel import jobs, registry
from raymodel._internal import name_rules
from raymodel.cli._jobs import add_set_option, attach, parse_pairs
from raymodel.cli._serving import add_rollout_options, rollout_steps
from raymodel.jobs import check_register, load_data, split_sets


def add_commands(sub: Any) -> None:
    cmd = sub.add_parser(
        "release", help="train a registry version further, gate it, register it, roll it out and promote it (one job)"
    )
    cmd.add_argument("ref", help="the version to train further: KEY, KEY:VERSION or KEY@ALIAS")
    cmd.add_argument("--data", required=True, metavar="MODULE:OBJECT", help="the data (with a valid split)")
    add_set_option(cmd, "a TrainSettings field or a config key")
    cmd.add_argument("--register", required=True, metavar="KEY[@ALIAS]", help="where the candidate goes")
    add_release_options(cmd, required=True)
    cmd.add_argument("--wait", action="store_true", help="follow it to its end; exit 1 unless it is promoted")
    cmd.set_defaults(handler=_release)


def add_release_options(cmd: argparse.ArgumentParser, *, required: bool) -> None:
    """A release's gate and rollout, as ``raymodel release`` and ``raymodel k8s job --release`` take them."""
    cmd.add_argument("--gate", required=required, metavar="METRIC", help="the figure the gate compares, e.g. val_acc")
    cmd.add_argument("--mode", choices=("max", "min"), default="max", help="higher (max) or lower is better")
    cmd.add_argument("--min-delta", type=float, default=0.0, help="how much better than --against (default 0)")
    cmd.add_argument("--against", metavar="REF", help="the version to beat, e.g. digits@production")
    cmd.add_argument("--threshold", type=float, help="the score the candidate must reach whatever --against scores")
    cmd.add_argument("--route", help="a served route of --against's alias: the candidate is rolled out there")
    add_rollout_options(cmd, "0.1,0.5,1", 30.0)


def release_flags(args: argparse.Namespace) -> list[str]:
    """The release options of ``args`` that differ from their defaults, as ``raymodel release`` flags again."""
    probe = argparse.ArgumentParser(add_help=False)
    add_release_options(probe, required=False)
    flags: list[str] = []
    for dest, default in vars(probe.parse_args([])).items():
        value = getattr(args, dest, None)
        if value is not None and value != default:
            flags += [f"--{dest.replace('_', '-')}", str(value)]
    return flags


def _release(args: argparse.Namespace) -> int:
    # Every check that needs no cluster first: the reference, the data, the `--set` keys, gate and plan.
    key, version = name_rules.parse_ref(args.ref)
    reg = registry.open(args.registry)
    record = reg.show(key, version)  # raises, naming the versions and aliases that exist
    check_register(args.register)
    steps = rollout_steps(args.steps)
    gate = jobs.Gate(args.gate, args.mode, args.min_delta, args.against, args.threshold)
    guard = {"max_error_rate": args.max_error_rate, "max_p99_ms": args.max_p99_ms, "min_requests": args.min_requests}
    plan = jobs.RolloutPlan(steps, args.step_s, guard)
    data = load_data(args.data)
    settings, config = split_sets(parse_pairs(args.pairs), "train", record.lineage.get("config") or {})
    attach()
    job = jobs.submit(
        f"{key}:{record.version}",
        "release",
        settings=settings,
        data=data,
        config=config,
        register=args.register,
        registry=reg.uri,
        gate=gate,
        route=args.route,
        rollout=plan,
    )
    print(f"{job.id} submitted: release {key}:{record.version} -> {args.register}", flush=True)
    if not args.wait:
        return 0
    return 0 if jobs.follow_release(job).status == "SUCCEEDED" else 1
