"""The compiler: from a pending graph to fused kernels in the kernel IR."""
