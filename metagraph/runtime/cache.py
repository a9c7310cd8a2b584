"""Compiled kernels on disk, shared between processes, never trusted blindly.

Layout under the cache directory:  batch-<hash>.c (the source a person can read: .c, .ll or
.bang.c by backend) beside batch-<hash>.so (or .o), and index/<kernel key>, which names the binary
holding that kernel and the binary's SHA-256. The key hashes the kernel's source with the
toolchain identity (compiler, version, flags, target CPU) and CACHE_VERSION. Every file is
written to a temporary name and renamed, so a killed process leaves no half-written entry, only a
temporary file, which the first write of a later process removes once it is STALE_SECONDS old. An
entry whose object is missing or does not match its hash is rebuilt (so is one whose object lacks
the kernel: codegen/compiled.py). tuning/<key of a kernel name> holds the tile parameters that
timing chose for that kernel (pipeline/tuning.py), as text; schedules/<digest>.json the schedules
of graph structures (pipeline/stored.py). A directory that cannot be written
(a read-only home, a parent that cannot be created) is replaced by a private temporary one, with a
warning, for the rest of the process.
"""
import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import time
import warnings

CACHE_VERSION = "1"
TEMPORARY_PREFIX = ".tmp-"
STALE_SECONDS = 3600    # a temporary file this old is no live compile's (one takes seconds, at
                        # most minutes: the C compiler is given ten)

_usable = {}            # the directory asked for -> the one used (itself, or a temporary fallback)
_swept = set()          # directories whose stale temporary files this process has removed
_lock = threading.Lock()    # batches are compiled, and written, from several threads at once


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path, data):
    """Write bytes or text to path through a temporary file in the same directory."""
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _prepare(directory):
    """Create the cache's folders and prove the directory writable; raises OSError otherwise."""
    for folder in ("index", "tuning"):
        os.makedirs(os.path.join(directory, folder), exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX)
    os.close(fd)
    os.unlink(probe)


def usable_directory(directory):
    """`directory`, ready for use; if it cannot be written, a private temporary directory (removed
    at exit) with one warning naming both. Decided once per directory per process."""
    with _lock:
        if directory not in _usable:
            try:
                _prepare(directory)
                _usable[directory] = directory
            except OSError as error:
                fallback = tempfile.mkdtemp(prefix="metagraph-cache-")
                atexit.register(shutil.rmtree, fallback, ignore_errors=True)
                _prepare(fallback)
                warnings.warn(f"metagraph: the kernel cache directory {directory} cannot be written "
                              f"({error.strerror or error}); compiled kernels go to {fallback} for "
                              "this process and are not kept")
                _usable[directory] = fallback
        return _usable[directory]


def _sweep_once(directory):
    """Remove the temporary files that killed processes left, the first time this process writes."""
    with _lock:
        if directory in _swept:
            return
        _swept.add(directory)
    oldest = time.time() - STALE_SECONDS
    for folder in (directory, os.path.join(directory, "index"), os.path.join(directory, "tuning")):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.name.startswith(TEMPORARY_PREFIX) and entry.stat().st_mtime < oldest:
                    os.unlink(entry.path)
            except OSError:
                pass        # another process removed it first, or it is not ours to remove


class KernelCache:
    """Maps kernel keys to shared objects on disk."""

    def __init__(self, directory, identity, source_suffix=".c", binary_suffix=".so"):
        self.directory = usable_directory(directory)
        self.identity = identity
        self.source_suffix, self.binary_suffix = source_suffix, binary_suffix

    def key(self, kernel_source):
        return hashlib.sha256(f"{CACHE_VERSION}\n{self.identity}\n{kernel_source}".encode()).hexdigest()

    def find(self, key):
        """The shared object holding the kernel with this key, if a sound one exists."""
        try:
            with open(os.path.join(self.directory, "index", key)) as entry:
                name, digest = entry.read().split()
        except (OSError, ValueError):
            return None
        path = os.path.join(self.directory, name)
        try:
            if _sha256_file(path) != digest:
                return None
        except OSError:
            return None
        return path

    def tuned(self, name):
        """The text remembered for kernel `name` by `remember` (a tuning choice), or None."""
        try:
            with open(self._tuning_path(name)) as entry:
                return entry.read()
        except OSError:
            return None

    def remember(self, name, text):
        _sweep_once(self.directory)
        write_atomic(self._tuning_path(name), text)

    def _tuning_path(self, name):
        return os.path.join(self.directory, "tuning", self.key(name))

    def build(self, source, keys, compile_shared):
        """Compile `source` once into a shared object and index it under every key."""
        _sweep_once(self.directory)
        batch = "batch-" + hashlib.sha256(f"{self.identity}\n{source}".encode()).hexdigest()[:16]
        source_path = os.path.join(self.directory, batch + self.source_suffix)
        object_path = os.path.join(self.directory, batch + self.binary_suffix)
        write_atomic(source_path, source)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=TEMPORARY_PREFIX,
                                         suffix=self.binary_suffix)
        os.close(fd)
        try:
            compile_shared(source_path, temporary)
            os.replace(temporary, object_path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        digest = _sha256_file(object_path)
        for key in keys:
            entry = f"{batch}{self.binary_suffix} {digest}\n"
            write_atomic(os.path.join(self.directory, "index", key), entry)
        return object_path, source_path
