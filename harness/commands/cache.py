"""`quantgate cache ls|clear`: what the cache holds (artifacts, stage results, converted models) and removing it."""

from __future__ import annotations

import time

from harness.cache import cache_root, read_json, remove_tree, tree_size

KINDS = ("artifacts", "results", "models")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="inspect or clear the cache",
                                   description="The cache lives in $QUANTGATE_CACHE (default ~/.cache/quantgate).")
    actions = parser.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    listing = actions.add_parser("ls", help="list cache entries")
    listing.add_argument("--kind", choices=KINDS)
    clearing = actions.add_parser("clear", help="remove cache entries")
    clearing.add_argument("--kind", choices=KINDS, help="only this kind (default: artifacts and results)")
    parser.set_defaults(func=run)


def run(args) -> int:
    root = cache_root()
    kinds = [args.kind] if args.kind else (KINDS if args.cache_action == "ls" else ("artifacts", "results"))
    if args.cache_action == "clear":
        freed = 0
        for kind in kinds:
            freed += tree_size(root / kind) if (root / kind).exists() else 0
            remove_tree(root / kind)
        print(f"cleared {', '.join(kinds)} in {root} ({freed / 2**20:,.1f} MiB)")
        return 0
    print(f"cache: {root}")
    for kind in kinds:
        folder = root / kind
        entries = sorted(folder.iterdir()) if folder.exists() else []
        print(f"{kind}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        for entry in entries:
            size = tree_size(entry) if entry.is_dir() else entry.stat().st_size
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.stat().st_mtime))
            detail = ""
            manifest = read_json(entry / "quantgate_manifest.json") if entry.is_dir() else None
            if manifest:
                recipe = manifest.get("recipe", {})
                detail = f"{manifest.get('engine')} bits={recipe.get('bits')} group={recipe.get('group_size')}"
            print(f"  {entry.name:<48} {size / 2**20:>9,.1f} MiB  {when}  {detail}")
    return 0
