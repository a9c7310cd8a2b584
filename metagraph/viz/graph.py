"""`mg.viz.graph(tensors, path)`: the graph that realising `tensors` would run, cut into its kernels,
drawn without running it.

The schedule (fusion and lowering, compiler/lower.py) is taken from the active backend's schedule
cache or made as a realisation would make it, but nothing is compiled or computed, and the
tensors stay pending. Each kernel is a Graphviz cluster titled by its name, its kind and what it
was built from (compiler/provenance.py: `conv2d+relu @ model.py:41`). Inside it: the value it
writes to memory (a bold box, "-> memory"), the element-wise ops fused into it (ellipses), the
views it reads through (dashed boxes), its reductions (hexagons; a contraction, reduce(add) of a
product, is marked so in the title). Realised inputs are grey cylinders; bold edges are reads
from memory. A cheap value that two kernels each recompute appears in both; shared constants are
left out. In-place updates waiting for the next realisation (`backend.defer`) are not part of
the picture. Graphviz's `dot` (an optional system package) renders it when installed; otherwise
the DOT text is written.
"""
import os
import shutil
import subprocess
import warnings

from metagraph import backend, flags
from metagraph.compiler import provenance
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.errors import ArgumentError, MetagraphError
from metagraph.ops.node import Node
from metagraph.ops.table import ELEMENTWISE, TABLE, VIEW

RENDERED = (".svg", ".png", ".pdf")
KINDS = {"e": "element-wise", "r": "reduction", "g": "gather", "s": "scatter"}


def dot(tensors):
    """The Graphviz DOT text of the pending graph of `tensors` (a Tensor or a list of them), one
    cluster per kernel its realisation would launch (see the module docstring)."""
    graph = pending_graph(_nodes(tensors))
    steps = _steps(graph)
    owner = {step.positions[0]: k for k, step in enumerate(steps)}
    lines = ["digraph metagraph {", '  rankdir=TB; compound=true; newrank=true; fontname="Helvetica";',
             '  node [fontname="Helvetica", fontsize=10]; edge [color="#555555"];']
    inputs = set()
    for k, step in enumerate(steps):
        members = provenance.members(graph, step)
        origin = provenance.origin(graph, members)
        title = [step.name, _kind(graph, step, members), str(origin)]
        lines += [f"  subgraph cluster_{k} {{", f"    label={_quote(chr(10).join(title))};",
                  '    style="rounded,filled"; color="#4c72b0"; fillcolor="#f3f6fb"; fontsize=11;']
        lines += [f"    {_id(p, k)} [{_style(graph.nodes[p], p == step.positions[0])}];" for p in members]
        lines.append("  }")
        inside = set(members)
        for p in members:
            for source in graph.nodes[p].inputs:
                q = graph.position[source.id]
                if q in inside:
                    lines.append(f"  {_id(q, k)} -> {_id(p, k)};")
                elif q in owner:
                    lines.append(f"  {_id(q, owner[q])} -> {_id(p, k)} [penwidth=2];")
                elif source.op != "const":
                    inputs.add(q)
                    lines.append(f"  {_id(q)} -> {_id(p, k)} [penwidth=2];")
    for q in sorted(inputs):
        node = graph.nodes[q]
        label = f"buffer\n{_shape(node)}\n{_where(node)}"
        lines.append(f'  {_id(q)} [label={_quote(label)}, shape=cylinder, style=filled, '
                     'fillcolor="#dddddd"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def graph(tensors, path, dpi=None):
    """Draw the pending graph of `tensors` to `path`: SVG, PNG or PDF by its suffix (at `dpi` dots
    per inch for a PNG; Graphviz's default is 96) when Graphviz's `dot` is installed, else (and for
    a .dot or .gv path) the DOT text, written beside it with a warning saying so. Returns the path
    written. Nothing is computed."""
    text = dot(tensors)
    stem, suffix = os.path.splitext(path)
    suffix = suffix.lower()
    if suffix in (".dot", ".gv"):
        return _write(path, text)
    if suffix not in RENDERED:
        raise ArgumentError(f"viz.graph: cannot tell a format from {path!r}; name a .svg, .png, .pdf, "
                            ".dot or .gv file")
    program = shutil.which("dot")
    if program is None:
        written = _write(stem + ".dot", text)
        warnings.warn(f"viz.graph: Graphviz's `dot` is not installed, so {path} was not drawn; the DOT "
                      f"text is in {written} (install Graphviz, e.g. apt-get install graphviz, to render it)",
                      stacklevel=2)
        return written
    options = [] if dpi is None else [f"-Gdpi={float(dpi):g}"]
    done = subprocess.run([program, "-T" + suffix[1:], *options, "-o", path], input=text.encode(),
                          capture_output=True, timeout=300)
    if done.returncode:
        raise MetagraphError(f"viz.graph: dot failed ({done.returncode}): {done.stderr.decode().strip()}")
    return path


def _nodes(tensors):
    """The nodes of a Tensor, a Node or a list or tuple of them."""
    items = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    nodes = []
    for item in items:
        node = item if isinstance(item, Node) else getattr(item, "node", None)
        if not isinstance(node, Node):
            raise ArgumentError(f"viz.graph: expects tensors, got {type(item).__name__}")
        nodes.append(node)
    if not nodes:
        raise ArgumentError("viz.graph: expects at least one tensor")
    return [node for node in nodes if node.buffer is None]


def _steps(graph):
    """The kernel launches realising `graph` would make: the active backend's cached schedule, or
    one made as its realisation would make it (nothing is compiled)."""
    instance = backend._instance(backend.get_backend())
    cached = getattr(instance, "schedules", {}).get((graph.key, flags.LIBRARY))
    if cached is not None:
        return cached.steps
    if hasattr(instance, "lowered"):
        return instance.lowered(graph)
    return schedule(graph, Target(), bool(flags.LIBRARY))


def _kind(graph, step, members):
    """What a kernel is: a library contraction, a contraction (reduce(add) of a product), or its
    name's kind (element-wise, reduction, gather, scatter)."""
    if step.library is not None:
        return "contraction (library)"
    contraction = any(graph.nodes[p].op == "reduce" and graph.nodes[p].attrs["op"] == "add" and
                      graph.nodes[p].inputs[0].op == "mul" for p in members)
    fused = sum(TABLE[graph.nodes[p].op].kind == ELEMENTWISE for p in members)
    if not fused and TABLE[graph.nodes[step.positions[0]].op].kind == VIEW:
        return "copy of a view"
    kind = "contraction" if contraction else KINDS.get(step.name[0], "kernel")
    return f"{kind}; {fused} element-wise op{'s' * (fused != 1)}"


def _style(node, written):
    """Graphviz attributes of a node inside a kernel; `written`: the value the kernel stores."""
    detail = node.op
    if node.op in ("reduce", "reindex_reduce"):
        detail += f" {node.attrs['op']}"
    label = f"{detail}\n{_shape(node)}" + (f"\n{node.composite}" if node.composite else "")
    if written:
        return f'label={_quote(label + chr(10) + "-> memory")}, shape=box, style="bold,filled", ' \
               'fillcolor="#dbe6f4"'
    kind = TABLE[node.op].kind if node.op in TABLE else None
    if kind == VIEW:
        return f"label={_quote(label)}, shape=box, style=dashed"
    if kind == ELEMENTWISE:
        return f"label={_quote(label)}, shape=ellipse"
    return f"label={_quote(label)}, shape=hexagon"


def _shape(node):
    return f"{tuple(node.shape)} {node.dtype.name}"


def _where(node):
    path, line = node.location
    return f"{os.path.basename(path)}:{line}"


def _id(position, kernel=None):
    return f"n{position}" if kernel is None else f"n{position}_k{kernel}"


def _quote(text):
    """A DOT string: backslashes and quotes escaped, newlines as centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _write(path, text):
    with open(path, "w") as stream:
        stream.write(text)
    return path
