"""The user cache (models, quantized artifacts, stage results) and the file primitives every stage uses.

Keys are content hashes of everything that determines a result, never paths or mtimes. A cached directory
(a quantized artifact, a converted model) is sealed with its files' hashes and used only while they match.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from harness import progress
from harness.errors import UserError

CACHE_ENV = "QUANTGATE_CACHE"
SEAL = "quantgate_seal.json"


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "quantgate")
    return _make_dir(Path(root))


def cache_dir(kind: str) -> Path:
    return _make_dir(cache_root() / kind)


def _make_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cache {path}: cannot create it ({exc.strerror or exc}); set {CACHE_ENV} to a writable "
                        "directory") from None
    return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def stable_hash(value: Any) -> str:
    """Hash of a JSON-able value, independent of dict ordering."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and rename: a reader never sees half a file. The file keeps
    the permissions it had (a new one gets the umask's), and an error names `path`, never the temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 less the umask, as open() gives
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if (mode := _mode_of(path)) is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno != errno.ENOSPC:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        full = OSError(errno.ENOSPC, exc.strerror or "No space left on device", str(path))
        full.bytes_needed = len(text.encode("utf-8"))  # what this write needed; the old file, if any, is intact
        raise full from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _mode_of(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """A result file, or None when it is missing or not valid JSON (a corrupt entry is rebuilt, not used)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def seal_dir(path: Path) -> None:
    """Record the hash of each file in `path` so a truncated or edited entry is detected and rebuilt, never used."""
    files = {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file() and f.name != SEAL}
    atomic_write_json(path / SEAL, files)


def is_sealed(path: Path, required: tuple[str, ...]) -> bool:
    """True when `path` was sealed with every `required` file and each sealed file still has its hash."""
    seal = read_json(path / SEAL)
    if not isinstance(seal, dict) or any(name not in seal for name in required):
        return False
    for name, digest in seal.items():
        file = path / name
        if not file.is_file() or sha256_file(file) != digest:
            progress.say(f"cache: {file} is missing or corrupt; rebuilding it")
            return False
    return True
