"""`quantgate cache ls|clear`: what the cache holds and removing it.

Every subdirectory of the cache root is a kind (artifacts, results, models, downloads, fingerprints, datasets,
hf_home, tmp, matplotlib, ...); `ls` lists each with its size and the total, `ls KIND` its entries,
`clear KIND...` or `clear --all` removes them.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.cache import CACHE_ENV, cache_root, read_json, remove_tree, tree_size
from harness.errors import UserError

MIB = 2**20


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="inspect or clear the cache",
                                   description=f"The cache lives in ${CACHE_ENV} (default ~/.cache/quantgate).")
    actions = parser.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    listing = actions.add_parser("ls", help="every kind with its size, or one kind's entries")
    listing.add_argument("kind", nargs="?", help="list this kind's entries (a subdirectory of the cache)")
    clearing = actions.add_parser("clear", help="remove one or more kinds, or everything")
    clearing.add_argument("kinds", nargs="*", metavar="KIND", help="kinds to remove (see `quantgate cache ls`)")
    clearing.add_argument("--all", action="store_true", help="remove every kind")
    parser.set_defaults(func=run)


def run(args) -> int:
    root = cache_root()
    if args.cache_action == "clear":
        return clear(root, args.kinds, args.all)
    if args.kind:
        list_entries(root, _existing_kinds(root, [args.kind])[0])
    else:
        list_kinds(root)
    return 0


def kinds_in(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def list_kinds(root: Path) -> None:
    print(f"cache: {root}")
    total = 0
    for folder in kinds_in(root):
        size = tree_size(folder)
        total += size
        count = sum(1 for _ in folder.iterdir())
        print(f"  {folder.name:<20} {count:>6} {'entry' if count == 1 else 'entries':<7}  {size / MIB:>10,.1f} MiB")
    print(f"  {'total':<20} {'':>14}  {total / MIB:>10,.1f} MiB")


def list_entries(root: Path, kind: str) -> None:
    folder = root / kind
    entries = sorted(folder.iterdir())
    print(f"{kind} in {root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
          f"{tree_size(folder) / MIB:,.1f} MiB")
    for entry in entries:
        size = tree_size(entry) if entry.is_dir() else entry.stat().st_size
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.stat().st_mtime))
        print(f"  {entry.name:<48} {size / MIB:>9,.1f} MiB  {when}  {_detail(entry)}")


def clear(root: Path, kinds: list[str], everything: bool) -> int:
    if everything and kinds:
        raise UserError("cache clear: name kinds or pass --all, not both")
    if not everything and not kinds:
        raise UserError("cache clear: name the kinds to remove (see `quantgate cache ls`), or pass --all")
    folders = kinds_in(root) if everything else [root / k for k in _existing_kinds(root, kinds)]
    freed = sum(tree_size(f) for f in folders)
    for folder in folders:
        remove_tree(folder)
    names = ", ".join(f.name for f in folders) or "nothing"
    print(f"cleared {names} in {root} ({freed / MIB:,.1f} MiB)")
    return 0


def _existing_kinds(root: Path, kinds: list[str]) -> list[str]:
    known = [p.name for p in kinds_in(root)]
    for kind in kinds:
        if kind not in known:  # also refuses paths such as ../x: only direct subdirectories are kinds
            raise UserError(f"cache: no kind '{kind}' in {root} (there: {', '.join(known) or 'nothing'}); "
                            "see `quantgate cache ls`")
    return kinds


def _detail(entry: Path) -> str:
    manifest = read_json(entry / "quantgate_manifest.json") if entry.is_dir() else None
    if not isinstance(manifest, dict):
        return ""
    recipe = manifest.get("recipe") or {}
    return f"{manifest.get('engine')} bits={recipe.get('bits')} group={recipe.get('group_size')}"
