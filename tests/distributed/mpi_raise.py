"""Run by test_mpi.py under `mpirun -n 2`: rank 1 raises while rank 0 waits in an all_reduce that
rank 1 never joins. The exception must end the whole job (MPI_Abort from the hook that
init_process_group installs), with rank 1's error in the output, instead of leaving rank 0 waiting."""
import metagraph as mg
import metagraph.distributed as dist

dist.init_process_group()
if dist.get_rank() == 1:
    raise ValueError("rank 1 fails on purpose")
dist.all_reduce(mg.ones(4))
print("rank 0 was not stopped", flush=True)
