"""The disk cache: a second process compiles nothing; a killed compile, a corrupt or stale entry
or an unwritable directory leaves a cache that still works; compile errors say where to look."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import metagraph as mg
from metagraph.pipeline.realize import Pipeline
from metagraph.codegen import c, toolchain
from metagraph.runtime.cache import KernelCache
from tests.helpers import needs

SUFFIXES = {"c": (".c", ".so"), "llvm": (".ll", ".o")}

PROGRAM = textwrap.dedent("""
    import metagraph as mg
    import metagraph.nn.functional as F
    x = mg.rand(4, 3, 9, 9)
    w = mg.rand(5, 3, 3, 3)
    with mg.profile() as prof:
        y = F.relu(F.conv2d(x, w, padding=1)).sum()
        z = (x.exp() * 2).max()
        mg.sync(y, z)
    print("compiles", prof.compiles, "hits", prof.cache_hits, mg.get_backend())
""")


def run(cache_dir, env=None, program=PROGRAM):
    environment = {k: v for k, v in os.environ.items() if k != "METAGRAPH_BACKEND"}
    environment.update(METAGRAPH_CACHE_DIR=str(cache_dir), **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_second_process_compiles_nothing(tmp_path, backend):
    needs(backend)
    first = run(tmp_path, env={"METAGRAPH_BACKEND": backend})
    assert first.returncode == 0, first.stderr
    assert "compiles 0" not in first.stdout and first.stdout.strip().endswith(backend)
    second = run(tmp_path, env={"METAGRAPH_BACKEND": backend})
    assert second.returncode == 0, second.stderr
    assert "compiles 0 hits" in second.stdout, second.stdout
    source_suffix, binary_suffix = SUFFIXES[backend]
    sources = [f for f in os.listdir(tmp_path) if f.endswith(source_suffix)]
    assert sources and all(os.path.exists(tmp_path / (f[: -len(source_suffix)] + binary_suffix))
                           for f in sources)
    assert "void " in (tmp_path / sources[0]).read_text()  # the source sits beside its binary


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_corrupt_entry_is_rebuilt(tmp_path, backend):
    needs(backend)
    assert run(tmp_path, env={"METAGRAPH_BACKEND": backend}).returncode == 0
    binaries = [name for name in os.listdir(tmp_path) if name.endswith(SUFFIXES[backend][1])]
    assert binaries
    for name in binaries:
        with open(tmp_path / name, "r+b") as stream:
            stream.truncate(100)
    again = run(tmp_path, env={"METAGRAPH_BACKEND": backend})
    assert again.returncode == 0, again.stderr
    assert "compiles 0 " not in again.stdout


def test_killed_compile_leaves_a_usable_cache(tmp_path):
    needs("c")
    compiler = tmp_path / "cc-wrapper"  # sleeps inside compiles while SLOW is set
    marker = tmp_path / "compiling"
    compiler.write_text(
        '#!/bin/sh\ncase "$*" in *-shared*) [ -n "$SLOW" ] && touch "$MARKER" && sleep 60;; esac\n'
        'exec cc "$@"\n'
    )
    compiler.chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k != "METAGRAPH_BACKEND"}
    environment.update(
        METAGRAPH_CACHE_DIR=str(tmp_path / "cache"), CC=str(compiler), SLOW="1", MARKER=str(marker)
    )
    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        env=environment,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:  # wait until inside a compile
        time.sleep(0.05)
    assert marker.exists(), "the compiler was never called"
    os.killpg(process.pid, signal.SIGKILL)  # the process and the compiler it started
    process.wait()
    leftovers = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".so") and not f.startswith(".")]
    assert not leftovers
    rerun = run(tmp_path / "cache", env={"CC": str(compiler)})
    assert rerun.returncode == 0 and "compiles" in rerun.stdout, rerun.stderr
    assert run(tmp_path / "cache", env={"CC": str(compiler)}).stdout.startswith("compiles 0 ")


def test_cache_key_covers_the_toolchain(tmp_path):
    one, other = KernelCache(str(tmp_path), "gcc 12 znver3"), KernelCache(str(tmp_path), "gcc 12 skylake")
    assert one.key("void k(){}") != other.key("void k(){}")
    assert one.find(one.key("void k(){}")) is None


def test_without_a_c_compiler_llvm_is_chosen(tmp_path):
    result = run(tmp_path, env={"CC": str(tmp_path / "no-such-compiler")})
    assert result.returncode == 0, result.stderr
    assert "backend 'c' is unavailable" in result.stderr
    assert result.stdout.strip().endswith("llvm")


def test_without_c_and_llvm_numpy_is_chosen(tmp_path):
    hidden = tmp_path / "hide"          # an llvmlite that cannot be imported shadows the real one
    (hidden / "llvmlite").mkdir(parents=True)
    (hidden / "llvmlite" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    result = run(tmp_path, env={"CC": str(tmp_path / "no-such-compiler"), "PYTHONPATH": str(hidden)})
    assert result.returncode == 0, result.stderr
    assert "backend 'llvm' is unavailable (llvmlite is unusable: hidden by the test)" in result.stderr
    assert result.stdout.strip().endswith("numpy")


def test_backend_by_environment_and_by_call(tmp_path):
    result = run(
        tmp_path,
        env={"METAGRAPH_BACKEND": "numpy"},
        program="import metagraph as mg\nprint(mg.get_backend())",
    )
    assert result.stdout.strip() == "numpy"
    with pytest.raises(mg.MetagraphError, match="unknown backend"):
        mg.set_backend("cuda")


def test_compile_error_names_the_source_the_log_and_the_users_line(tmp_path, monkeypatch):
    needs("c")
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    with pytest.raises(toolchain.CompileError, match=r"bad.c .*its output is in .*bad.c.log"):
        toolchain.compile_shared(str(bad), str(tmp_path / "bad.so"))

    def failing(source_path, output_path, libraries=()):
        raise toolchain.CompileError(f"the C compiler failed on {source_path}")

    monkeypatch.setattr(c, "compile_shared", failing)
    monkeypatch.setattr(mg.backend, "_active", Pipeline(c.CBackend()))   # a backend that has loaded nothing
    monkeypatch.setattr(mg.backend._active.cache, "find", lambda key: None)
    x = mg.rand(3)
    y = x * 123.456 + 7  # the line the error must name
    with pytest.raises(toolchain.CompileError, match=r"values created at test_cache.py:\d+"):
        y.numpy()


def test_check_mode_catches_a_wrong_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(mg.flags, "CHECK", 1)
    monkeypatch.setattr(mg.flags, "CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(c.OPS, "add", "({0} - {1})")  # a deliberately wrong backend
    needs("c")
    monkeypatch.setattr(mg.backend, "_active", Pipeline(c.CBackend()))   # its kernels stay with this test
    with pytest.raises(mg.MetagraphError, match=r"METAGRAPH_CHECK: kernel e_N_\w+ gives .*source:"):
        (mg.tensor([1.0, 2.0, 3.0]) + 1.0).numpy()


def test_debug_prints_kernels_and_source(tmp_path):
    result = run(tmp_path, env={"METAGRAPH_DEBUG": "2"})
    assert result.returncode == 0, result.stderr
    assert "metagraph: compiled" in result.stderr and re.search(r"void @?r_", result.stderr)
    assert "metagraph: r_" in result.stderr  # one line per launch


def test_unwritable_cache_directory_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    needs("c")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    wanted = str(blocked / "cache")     # nobody can create it, root included (chmod would not stop root)
    monkeypatch.setattr(mg.flags, "CACHE_DIR", wanted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = Pipeline(c.CBackend()), Pipeline(c.CBackend())
    used = first.cache.directory
    assert used != wanted and second.cache.directory == used and os.path.isdir(used)
    assert [str(w.message).count(wanted) + str(w.message).count(used) for w in caught] == [2], caught
    monkeypatch.setattr(mg.backend, "_active", first)
    assert (mg.tensor([1.0, 2.0]) * 3.0 + 1.0).tolist() == [4.0, 7.0]
    assert any(name.endswith(".so") for name in os.listdir(used))


def _indexed(backend, compute):
    """The index keys that computing `compute()` on `backend` adds."""
    before = set(backend.functions)
    compute()
    return set(backend.functions) - before


@pytest.mark.parametrize("backend", ["c", "llvm", "bang"])
def test_entry_whose_binary_lacks_the_kernel_is_rebuilt(tmp_path, monkeypatch, backend):
    needs(backend)
    monkeypatch.setattr(mg.flags, "CACHE_DIR", str(tmp_path))
    kind = type(mg.backend._instance(backend).generator)
    monkeypatch.setattr(mg.backend, "_active", Pipeline(kind()))      # its kernels stay with this test
    x = mg.tensor([1.0, 2.0, 3.0])
    stale = _indexed(mg.backend._active, lambda: (x * 5.0 - 1.0).numpy())
    foreign = _indexed(mg.backend._active, lambda: (x.exp() * x).sum().numpy())
    foreign_entry = (tmp_path / "index" / sorted(foreign)[0]).read_text()
    for key in stale:    # a sound binary (its hash matches) that holds some other kernel
        (tmp_path / "index" / key).write_text(foreign_entry)
    monkeypatch.setattr(mg.backend, "_active", Pipeline(kind()))
    with mg.profile() as prof:
        assert (x * 5.0 - 1.0).tolist() == [4.0, 9.0, 14.0]
    assert prof.compiles == len(stale) and prof.cache_hits == 0
    monkeypatch.setattr(mg.backend, "_active", Pipeline(kind()))
    with mg.profile() as prof:
        assert (x * 5.0 - 1.0).tolist() == [4.0, 9.0, 14.0]
    assert prof.compiles == 0 and prof.cache_hits == len(stale)     # the entry was rewritten


def test_old_temporary_files_are_swept_once_at_the_first_write(tmp_path):
    cache = KernelCache(str(tmp_path), "identity")
    old = [tmp_path / ".tmp-killed.so", tmp_path / "index" / ".tmp-abc", tmp_path / "tuning" / ".tmp-d"]
    recent = tmp_path / ".tmp-compiling.so"       # a live compile's, in another process
    hours_ago = time.time() - 2 * 3600
    for path in old + [recent]:
        path.write_bytes(b"partial")
    for path in old:
        os.utime(path, (hours_ago, hours_ago))
    assert all(path.exists() for path in old)      # opening the cache scans nothing
    cache.remember("kernel", "tile 4")
    assert not any(path.exists() for path in old) and recent.exists()
    later = tmp_path / ".tmp-later"
    later.write_bytes(b"partial")
    os.utime(later, (hours_ago, hours_ago))
    cache.remember("other", "tile 8")
    assert later.exists()           # scanned once per process, not at every write


def test_the_suite_keeps_its_kernels_out_of_the_users_cache():
    needs("c")
    users = os.path.realpath(os.path.join(os.path.expanduser("~"), ".cache", "metagraph"))
    used = os.path.realpath(mg.backend._instance("c").cache.directory)
    assert os.path.commonpath([users, used]) != users, used
    assert os.path.realpath(os.environ["METAGRAPH_CACHE_DIR"]) == used     # subprocesses inherit it
