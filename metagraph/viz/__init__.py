"""Seeing inside metagraph: the pending graph cut into its kernels (`graph`, `dot`), a profile's
timeline (`timeline`) and training curves (`curves`). Profiles name each kernel's ops and lines
themselves (`mg.profile()`, runtime/profiler.py)."""
from metagraph.viz.graph import dot, graph
from metagraph.viz.plots import curves, require_matplotlib, timeline

__all__ = ["curves", "dot", "graph", "require_matplotlib", "timeline"]
