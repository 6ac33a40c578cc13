"""``raymodel models list|show|alias|delete``: the registry from a shell.

The registry is ``RAYMODEL_REGISTRY`` (a folder or URI), else
``$RAYMODEL_HOME/registry``; ``--registry URI`` overrides both.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from raymodel.exceptions import RayModelError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raymodel", description="raymodel command line")
    parser.add_argument("--registry", help="registry folder or URI (default: RAYMODEL_REGISTRY or "
                                           "$RAYMODEL_HOME/registry)")
    sub = parser.add_subparsers(dest="group", required=True)
    models = sub.add_parser("models", help="the model registry").add_subparsers(dest="command", required=True)
    ls = models.add_parser("list", help="list versions (of KEY)")
    ls.add_argument("key", nargs="?")
    show = models.add_parser("show", help="show one version: KEY, KEY:VERSION or KEY@ALIAS")
    show.add_argument("ref")
    alias = models.add_parser("alias", help="point ALIAS at VERSION of KEY")
    alias.add_argument("key")
    alias.add_argument("version", type=int)
    alias.add_argument("alias")
    delete = models.add_parser("delete", help="delete VERSION of KEY")
    delete.add_argument("key")
    delete.add_argument("version", type=int)
    args = parser.parse_args(argv)

    from raymodel import registry

    reg = registry.open(args.registry)
    try:
        if args.command == "list":
            records = reg.list(args.key)
            if not records:
                print(f"(no models in {reg.uri})")
            rows = [["KEY", "VERSION", "ALIASES", "CREATED", "METRICS"]]
            for r in records:
                metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in r.metrics.items() if k != "epoch")
                rows.append([r.key, str(r.version), ",".join(r.aliases) or "-", r.created_iso, metrics or "-"])
            if records:
                widths = [max(len(row[i]) for row in rows) for i in range(4)]
                for row in rows:
                    print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        elif args.command == "show":
            key, version = _parse_ref(args.ref)
            r = reg.show(key, version)
            print(json.dumps({"key": r.key, "version": r.version, "aliases": r.aliases, "created": r.created_iso,
                              "class": r.model_class, "backend": r.backend, "metrics": r.metrics,
                              "metadata": r.metadata, "lineage": r.lineage}, indent=2, default=str))
        elif args.command == "alias":
            reg.set_alias(args.key, args.alias, args.version)
            print(f"{args.key}@{args.alias} -> version {args.version}")
        elif args.command == "delete":
            reg.delete(args.key, args.version)
            print(f"deleted {args.key}:{args.version}")
    except RayModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _parse_ref(ref: str) -> tuple[str, int | str | None]:
    if "@" in ref:
        key, alias = ref.split("@", 1)
        return key, alias
    if ":" in ref:
        key, version = ref.split(":", 1)
        return key, int(version) if version.isdigit() else version
    return ref, None


if __name__ == "__main__":
    raise SystemExit(main())
