"""The default thread count follows the CPUs this process may use, not the machine's."""
import os
import subprocess
import sys

import pytest

from metagraph import flags

PROGRAM = "import os; os.sched_setaffinity(0, {next(iter(os.sched_getaffinity(0)))}); " \
          "import metagraph as mg; print(mg.flags.NUM_THREADS)"


def _threads(environment):
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_a_process_pinned_to_one_cpu_runs_one_thread():
    environment = {k: v for k, v in os.environ.items() if k != "METAGRAPH_NUM_THREADS"}
    assert _threads(environment) == 1
    assert _threads(dict(environment, METAGRAPH_NUM_THREADS="3")) == 3     # the variable still wins


@pytest.mark.parametrize("files, want", [
    ({"cpu.max": "150000 100000\n"}, 2),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_a_cgroup_quota_caps_the_threads(tmp_path, files, want):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert flags._cgroup_quota(str(tmp_path)) == want
    assert flags.usable_cpus(str(tmp_path)) == min(len(os.sched_getaffinity(0)), want or 10 ** 6)
