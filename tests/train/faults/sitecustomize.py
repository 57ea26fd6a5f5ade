"""A full disk, injected at the writer: a process started with this folder on PYTHONPATH and
TOOLKIT_TEST_FULL_DISK=NAME gets ENOSPC from `write` once 4 KiB of any file whose path ends in NAME have been
written, as a filling disk gives it. (Python imports `sitecustomize` at start-up, so every rank a launcher
starts with this environment has it; nothing in the toolkit knows about it.)"""

import builtins
import errno
import os

_TARGET = os.environ.get("TOOLKIT_TEST_FULL_DISK")


class _FillingFile:
    def __init__(self, file):
        self._file, self._written = file, 0

    def write(self, data):
        self._written += len(data)
        if self._written > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


if _TARGET:
    import io

    _open = builtins.open

    def _open_filling(file, mode="r", *args, **kwargs):
        opened = _open(file, mode, *args, **kwargs)
        return _FillingFile(opened) if "w" in mode and str(file).endswith(_TARGET) else opened

    builtins.open = _open_filling
    io.open = _open_filling  # (pathlib's Path.open, which torch.distributed.checkpoint writes through)
