"""Runtime: the kernel cache on disk, the executor that launches kernels, the profiler."""
