"""``raymodel models list|show|alias|delete``: the registry from a shell."""

from __future__ import annotations

import argparse
import json
from typing import Any

from raymodel import registry
from raymodel._internal import name_rules


def add_commands(sub: Any) -> None:
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


def _registry(args: argparse.Namespace) -> Any:
    return registry.open(args.registry)


def _list(args: argparse.Namespace) -> None:
    reg = _registry(args)
    records = reg.list(args.key)
    if not records:
        print(f"(no models in {reg.uri})")
        return
    rows = [["KEY", "VERSION", "ALIASES", "CREATED", "METRICS"]]
    for r in records:
        metrics = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.metrics.items() if k != "epoch"
        )
        rows.append([r.key, str(r.version), ",".join(r.aliases) or "-", r.created_iso, metrics or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])


def _show(args: argparse.Namespace) -> None:
    key, version = name_rules.parse_ref(args.ref)
    r = _registry(args).show(key, version)
    print(
        json.dumps(
            {
                "key": r.key,
                "version": r.version,
                "aliases": r.aliases,
                "created": r.created_iso,
                "class": r.model_class,
                "backend": r.backend,
                "metrics": r.metrics,
                "metadata": r.metadata,
                "lineage": r.lineage,
            },
            indent=2,
            default=str,
        )
    )


def _alias(args: argparse.Namespace) -> None:
    version = name_rules.version(args.version)
    _registry(args).set_alias(args.key, args.alias, version)
    print(f"{args.key}@{args.alias} -> version {version}")


def _delete(args: argparse.Namespace) -> None:
    version = name_rules.version(args.version)
    _registry(args).delete(args.key, version)
    print(f"deleted {args.key}:{version}")
