"""``raymodel train|tune REF --data MODULE:OBJECT [--set KEY=VALUE ...] [--register KEY[@ALIAS]] [--wait]``:
a job on the training server that starts from a registry version (``rm.jobs.submit``)."""

from __future__ import annotations

import argparse
from typing import Any

from raymodel import jobs, registry
from raymodel._internal import name_rules
from raymodel.cli._jobs import add_set_option, attach, parse_pairs
from raymodel.jobs import check_register, load_data, split_sets


def add_commands(sub: Any) -> None:
    for kind, text in (
        ("train", "train a registry version further, as a job of the training server"),
        ("tune", "tune from a registry version's config (its hyperparameter_space), as a job of the server"),
    ):
        cmd = sub.add_parser(kind, help=text)
        cmd.add_argument("ref", help="KEY, KEY:VERSION or KEY@ALIAS")
        cmd.add_argument("--data", required=True, metavar="MODULE:OBJECT", help="the training data, importable here")
        field = f"a {'Train' if kind == 'train' else 'Tune'}Settings field" + (
            " (or train.FIELD)" if kind == "tune" else ""
        )
        add_set_option(cmd, field + " or a config key")
        cmd.add_argument("--register", metavar="KEY[@ALIAS]", help="register the result as the next version of KEY")
        cmd.add_argument("--wait", action="store_true", help="block until the job ends; exit 1 if it failed")
        cmd.set_defaults(handler=_submit_by_reference, kind=kind)


def _submit_by_reference(args: argparse.Namespace) -> int:
    # Every check before the cluster is joined: the reference, the data, the `--set` keys, the name.
    key, version = name_rules.parse_ref(args.ref)
    reg = registry.open(args.registry)
    record = reg.show(key, version)  # raises, naming the versions and aliases that exist
    if args.register is not None:
        check_register(args.register)
    data = load_data(args.data)
    settings, config = split_sets(parse_pairs(args.pairs), args.kind, record.lineage.get("config") or {})
    attach()
    job = jobs.submit(
        f"{key}:{record.version}",
        args.kind,
        settings=settings,
        data=data,
        config=config,
        register=args.register,
        registry=reg.uri,
    )
    print(f"{job.id} submitted: {args.kind} {key}:{record.version}" + (f" -> {args.register}" if args.register else ""))
    if not args.wait:
        return 0
    job.wait()
    made = job.registered
    print(f"{job.id} {job.status}" + (f": registered {made}" if made else ""))
    return 0
