"""What a kernel was built from: the user's composite ops and source lines of the nodes it computes.

A schedule is made once per graph structure and serves every later graph of that structure, built
by whatever lines: a kernel's origin is therefore read from the graph being run, never kept with
the kernel, nor in the part of its source that is hashed into its cache key (a kernel from two
lines compiles once). The positions a kernel computes are found once per schedule (`members`);
the nodes at those positions name the ops and lines of each run (`origin`), read only when
someone looks: a profile, METAGRAPH_DEBUG, or the comment heading a newly compiled source file.
"""
import os
from dataclasses import dataclass

from metagraph.ops.node import file_and_line

LINE_CACHE_SIZE = 1 << 14
_LINES = {}      # (id(code), offset) -> (code, (file, line)): the code is kept, so its id is not reused


@dataclass(frozen=True)
class Origin:
    """The composite ops (table ops built outside any composite; `<op>_backward` for the nodes of
    a gradient rule) and the user's (file, line)s of a kernel's nodes, each in graph order."""
    ops: tuple
    lines: tuple

    @property
    def ops_text(self):
        """`conv2d+batch_norm+relu`."""
        return "+".join(self.ops)

    def lines_text(self, full=False):
        """`model.py:41,42 train.py:7`: the lines grouped by file (whole paths when `full`)."""
        files = {}
        for path, line in self.lines:
            files.setdefault(path if full else os.path.basename(path), []).append(str(line))
        return " ".join(f"{path}:{','.join(lines)}" for path, lines in files.items())

    def __str__(self):
        return f"{self.ops_text} @ {self.lines_text()}"


def members(graph, step):
    """The graph positions a step's kernel computes: its output and what it inlines (a walk down
    from the output that stops at its parameters and at realised values), in graph order; shared
    constants are left out (the composite that first made one is not the one reading it)."""
    root = step.positions[0]
    reads, position = set(step.positions[1:]), graph.position
    found, stack = {root}, [graph.nodes[root]]
    while stack:
        for source in stack.pop().inputs:
            k = position[source.id]
            if k in found or k in reads or (source.buffer is not None and source.op != "const"):
                continue
            found.add(k)
            stack.append(source)
    return tuple(sorted(k for k in found if k == root or graph.nodes[k].op != "const"))


def origin(graph, positions):
    """The Origin of the nodes of `graph` at `positions` (a step's members)."""
    ops, views, sites = {}, {}, {}
    for k in positions:
        node = graph.nodes[k]
        if node.composite is not None:
            ops[node.composite] = None
        elif node.op == "reindex":        # a broadcast that an operator outside composites (+) made
            views[node.op] = None
        else:
            ops[node.op] = None
        sites.setdefault(id(node.site), node.site)     # a replayed composite's nodes share one site
    lines = dict.fromkeys(line_of(site) for site in sites.values())
    return Origin(tuple(ops or views), tuple(lines))


def line_of(site):
    """(file, line) of a site (a node's, or node.user_site's), remembered by code object and
    offset: resolving one scans its code's line table (3 us at the end of a long script's
    module-level code)."""
    code, offset = site
    if type(code) is str:
        return site
    key = (id(code), offset)
    known = _LINES.get(key)
    if known is not None and known[0] is code:
        return known[1]
    if len(_LINES) >= LINE_CACHE_SIZE:
        _LINES.clear()
    line = file_and_line(site)
    _LINES[key] = (code, line)
    return line


def header(named_origins, comment):
    """Comment lines, each begun by `comment` (`//`, `;`), naming what each (kernel name, Origin)
    was built from: what heads a newly compiled source file, outside the text its key hashes."""
    lines = [f"{comment} metagraph: what these kernels were first compiled for (a later graph of the same",
             f"{comment} structure, from other lines, reuses them; this comment is not part of their key)"]
    for name, found in named_origins:
        lines.append(_printable(f"{comment}   {name}: {found.ops_text} @ {found.lines_text(full=True)}"))
    return "\n".join(lines) + "\n"


def _printable(text):
    """One comment line: no character that could end it (a newline in a file name) or continue it."""
    return "".join(c if c.isprintable() else "?" for c in text).rstrip("\\")
