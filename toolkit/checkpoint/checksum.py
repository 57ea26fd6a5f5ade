"""A file's SHA-256, read in 1 MiB blocks: what a checkpoint records for each file it writes and checks before a
resume trusts it (toolkit.checkpoint.files for whole files, toolkit.checkpoint.sharded for DCP's shards)."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["file_sha256"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
