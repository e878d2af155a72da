"""`--cache URL`: the run's cache in an fsspec store (s3://bucket/quantgate, gs://..., file:///shared/...) that no
node needs to mount. Every node keeps its working copy at the driver's cache path (QUANTGATE_CACHE), so a stage's
result paths mean the same file everywhere; the store is what they share.

A format's Ray task pulls what its chain may reuse before it runs (every stage result, which includes the
baseline's fidelity references; the artifacts of this format; the converted demo model) and pushes what it wrote
after it, finished or not, so that a retry on another node picks up where it stopped. The driver pushes the
converted models before any task starts and pulls the stage results as each task ends (the report reads them).

Only a sealed artifact is pushed (its quantgate_seal.json names its files' hashes, harness.cache.seal_dir): a pulled
artifact whose files do not match its seal is quantized again, never used. A file already present with the same size
is not copied again; stage results are small JSON files, artifacts the checkpoint itself (docs/scale.md).

Tasks on one node share its working copy, and every task pulls the shared kinds as it starts: each copy goes to a
name of its own and is renamed into place, so two pulls of one file (or two pushes to a mounted store) never write
into each other's half-copied file; the last rename wins, with the same bytes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.cache import SEAL
from harness.errors import UserError

SHARED = ("results", "models")  # pulled whole; "artifacts/FORMAT-KEY" only for the format a task runs


def check_url(url: str) -> None:
    """Before any work: fsspec installed, the URL's protocol known to it, the store readable and writable."""
    if "://" not in url:
        raise UserError(f"--cache {url}: not a URL (s3://bucket/quantgate, file:///shared/quantgate); for a "
                        "directory every node mounts, set QUANTGATE_CACHE to it instead")
    try:
        import fsspec
    except ImportError:
        raise UserError(f"--cache {url}: fsspec is not installed here (pip install fsspec, and s3fs or gcsfs for "
                        "s3:// or gs://)") from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
        fs.makedirs(root, exist_ok=True)
        probe = f"{root.rstrip('/')}/.quantgate-write-test"
        fs.pipe_file(probe, b"ok")
        fs.rm_file(probe)
    except (ImportError, ValueError) as exc:
        raise UserError(f"--cache {url}: fsspec cannot open it ({exc})") from None
    except OSError as exc:
        raise UserError(f"--cache {url}: cannot write there ({exc.strerror or exc})") from None


@dataclass(frozen=True)
class RemoteCache:
    url: str

    def _fs(self):
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.url)
        return fs, root.rstrip("/")

    def pull(self, local: Path, formats: tuple[str, ...] = ()) -> int:
        """Files of the store the local cache lacks (or holds at another size), for SHARED and the artifacts of
        `formats`; the count copied."""
        fs, root = self._fs()
        wanted = [f"{root}/{kind}" for kind in SHARED]
        if formats and fs.isdir(f"{root}/artifacts"):
            wanted += [path for path in fs.ls(f"{root}/artifacts", detail=False)
                       if any(Path(path).name.startswith(f"{fmt}-") for fmt in formats)]
        copied = 0
        for top in wanted:
            if not fs.exists(top):
                continue
            for remote, info in fs.find(top, detail=True).items():
                if Path(remote).name.startswith("."):
                    continue  # another node's push, half-way
                target = local / Path(remote).relative_to(root)
                if target.is_file() and target.stat().st_size == info.get("size"):
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.pull")
                try:
                    fs.get_file(remote, str(partial))
                    partial.replace(target)  # a reader sees the whole file or none
                finally:
                    partial.unlink(missing_ok=True)
                copied += 1
        return copied

    def push(self, local: Path, kinds: tuple[str, ...] = SHARED, formats: tuple[str, ...] = ()) -> int:
        """Local files the store lacks (or holds at another size), for `kinds` and the sealed artifacts of
        `formats`, each artifact's seal last; the count copied."""
        fs, root = self._fs()
        sources = [local / kind for kind in kinds]
        if formats and (local / "artifacts").is_dir():
            sources += [d for d in sorted((local / "artifacts").iterdir()) if d.is_dir() and (d / SEAL).is_file()
                        and any(d.name.startswith(f"{fmt}-") for fmt in formats)]
        copied = 0
        for top in sources:
            if not top.is_dir():
                continue
            files = sorted((p for p in top.rglob("*") if p.is_file() and not p.name.startswith(".")),
                           key=lambda p: p.name == SEAL)  # the seal after the files it vouches for
            for path in files:
                remote = f"{root}/{path.relative_to(local).as_posix()}"
                if fs.exists(remote) and fs.size(remote) == path.stat().st_size:
                    continue
                fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                _put_whole(fs, path, remote)
                copied += 1
        return copied


def _put_whole(fs, path: Path, remote: str) -> None:
    """One file into the store so that a reader sees all of it or none: an object store's put is that already; a
    mounted directory (file://) gets a copy under a name of its own, then a rename."""
    if "file" not in _protocols(fs):
        fs.put_file(str(path), remote)
        return
    head, _, name = remote.rpartition("/")
    partial = f"{head}/.{name}.{uuid.uuid4().hex[:12]}.push"
    try:
        fs.put_file(str(path), partial)
        fs.mv(partial, remote)
    finally:
        if fs.exists(partial):
            fs.rm_file(partial)


def _protocols(fs) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
