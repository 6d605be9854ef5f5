"""Kernel-report rows kept on disk, keyed by everything that decides them.

Compiling every kernel for the report takes about half a minute of CPU, and the tests, the
notebooks that print a report and their student copies all ask for rows of the same library. A row
is stored under a key made of the kernel's name, the architecture, the text of every source
file of attention_lib and the versions of Numba, numba-cuda and NVIDIA's compiler wheels, so
any edit to the library, or another compiler, gives new keys and a fresh compile.

- ``RowCache(arch)``: ``load(names)``, ``save(rows)``, ``locked()`` (one process compiles
  while another waits for its rows). Rows live under ``ATTENTION_LIB_CACHE`` if set, else the
  user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``) in ``attention_lib/kernel_report``.
- ``NoCache()``: the same interface, storing nothing.
"""

import contextlib
import functools
import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

CACHE_VARIABLE = "ATTENTION_LIB_CACHE"
PACKAGE = Path(__file__).resolve().parents[1]   # attention_lib: every source file of the package
TOOL_DISTRIBUTIONS = ("numba", "numba-cuda", "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-nvdisasm")


def cache_folder():
    """Where rows are stored (created on first save)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention_lib" / "kernel_report"


@functools.lru_cache(maxsize=1)
def library_fingerprint():
    """A hash of every source file of the package but the exercises' checks, and of the compiler's versions."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "checks":         # the exercises' checks compile no library kernel
            continue
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in TOOL_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{name}={version}\0".encode())
    return digest.hexdigest()


class NoCache:
    """Stores nothing: every row is compiled."""

    def load(self, names):
        return {}

    def save(self, rows):
        return rows

    def locked(self):
        return contextlib.nullcontext()


class RowCache(NoCache):
    """Rows of one architecture for this exact library, one JSON file per kernel."""

    def __init__(self, arch, folder=None):
        self.arch, self.folder = arch, Path(folder) if folder else cache_folder()

    def _path(self, name):
        key = hashlib.sha256(f"{library_fingerprint()}\0{self.arch}\0{name}".encode()).hexdigest()[:32]
        return self.folder / f"{name}-{self.arch}-{key}.json"

    def load(self, names):
        rows = {}
        for name in names:
            try:
                rows[name] = json.loads(self._path(name).read_text())
            except (OSError, ValueError):       # absent, or half-written by a process that died
                pass
        return rows

    def save(self, rows):
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for name, row in rows.items():
                path = self._path(name)
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(json.dumps(row))
                os.replace(partial, path)       # atomic: a reader sees the old file or the whole new one
        except OSError:                         # a read-only home: the rows are still returned
            pass
        return rows

    @contextlib.contextmanager
    def locked(self):
        try:
            import fcntl
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.folder / ".lock", "w")
        except (ImportError, OSError):          # Windows or a read-only home: no waiting
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
