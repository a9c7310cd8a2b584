"""Compiled kernels on disk, shared between processes, never trusted blindly.

Layout under the cache directory:  batch-<hash>.c (the source a person can read: .c, .ll or
.bang.c by backend) beside batch-<hash>.so (or .o), and index/<kernel key>, which names the binary
holding that kernel and the binary's SHA-256. The key hashes the kernel's source with the
toolchain identity (compiler, version, flags, target CPU) and CACHE_VERSION. Every file is
written to a temporary name and renamed, so a killed process leaves no half-written entry; an
entry whose object is missing or does not match its hash is rebuilt. tuning/<key of a kernel
name> holds the tile parameters that timing chose for that kernel (codegen/tuning.py), as text.
"""
import hashlib
import os
import tempfile

CACHE_VERSION = "1"


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path, data):
    """Write bytes or text to path through a temporary file in the same directory."""
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class KernelCache:
    """Maps kernel keys to shared objects on disk."""

    def __init__(self, directory, identity, source_suffix=".c", binary_suffix=".so"):
        self.directory = directory
        self.identity = identity
        self.source_suffix, self.binary_suffix = source_suffix, binary_suffix
        os.makedirs(os.path.join(directory, "index"), exist_ok=True)
        os.makedirs(os.path.join(directory, "tuning"), exist_ok=True)

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
        write_atomic(self._tuning_path(name), text)

    def _tuning_path(self, name):
        return os.path.join(self.directory, "tuning", self.key(name))

    def build(self, source, keys, compile_shared):
        """Compile `source` once into a shared object and index it under every key."""
        batch = "batch-" + hashlib.sha256(f"{self.identity}\n{source}".encode()).hexdigest()[:16]
        source_path = os.path.join(self.directory, batch + self.source_suffix)
        object_path = os.path.join(self.directory, batch + self.binary_suffix)
        write_atomic(source_path, source)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=self.binary_suffix)
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
