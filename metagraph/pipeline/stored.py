"""Schedules remembered on disk: a process that has seen a graph's structure does not lower it again.

Lowering ResNet-18's training step costs about a second of Python even when every kernel is in
the cache; a process restarted on the same model would pay it for every new graph structure
(the first two steps differ: the optimizer's state appears in the second). So a schedule — for
each kernel launch: its cache key and source, the graph positions of its parameters, its run-time
checks, and what tuning needs to lower it again — is written as JSON to
<cache>/schedules/<digest>.json once its kernels are compiled, and again when tuning replaces a
kernel. The digest names the graph's structure by content (each node's op, attributes, shape and
dtype and the positions it reads: graph.key's signature numbers are this process's only), the
backend's toolchain identity and target, the flags that change lowering, and metagraph's own
source, so that a changed lowering never serves an old schedule. A file that does not parse, or
names a kernel the cache no longer holds, is ignored (and rewritten by the schedule made instead).
Graphs smaller than MIN_NODES are not stored: they lower in about the time reading a file takes.
"""
import hashlib
import json
import os
from dataclasses import fields
from functools import lru_cache

from metagraph import dtypes, errors, flags
from metagraph.codegen import library
from metagraph.compiler.contraction import LibraryContraction
from metagraph.compiler.lower import Step
from metagraph.runtime.cache import CACHE_VERSION, write_atomic

MIN_NODES = 64
FORMAT = 3
_TEXTS = {}          # signature number -> its content as text (numbers are never reused)
_TEXTS_SIZE = 1 << 14         # (a cache of text made again cheaply: cleared when full)


@lru_cache(maxsize=1)
def code_identity():
    """A hash of metagraph's own source files (lowering, code generators, templates, ops)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, subfolders, files in sorted(os.walk(root)):
        subfolders.sort()
        for name in sorted(files):
            if name.endswith((".py", ".j2", ".h")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as stream:
                    digest.update(stream.read())
    return digest.hexdigest()


def _node_text(number, node):
    """(op, attributes, shape, dtype) of `node` (whose signature is `number`) as text that is the
    same in every process, or None when an attribute has no such text (a repr with an address)."""
    text = _TEXTS.get(number)
    if text is None:
        attrs = sorted((node.attrs or {}).items())
        text = repr((node.op, [(k, v.hex() if isinstance(v, float) else v) for k, v in attrs],
                     node.shape, node.dtype))
        if " at 0x" in text:
            return None
        if len(_TEXTS) >= _TEXTS_SIZE:
            _TEXTS.clear()
        _TEXTS[number] = text
    return text


def graph_digest(graph, context):
    """The hex digest naming `graph`'s structure (and `context`) in every process, or None."""
    signatures, outputs = graph.key
    lines = [context, repr(outputs)]
    for entry, node in zip(signatures, graph.nodes):
        if entry[0] == "buffer":
            lines.append(repr(entry))
            continue
        text = _node_text(entry[0], node)
        if text is None:
            return None
        lines.append(f"{text} <- {entry[1:]}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


class ScheduleStore:
    """The schedules of one pipeline (pipeline.realize.Pipeline: a code generator) under its cache."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.directory = os.path.join(pipeline.cache.directory, "schedules")

    def _path(self, graph):
        if len(graph.nodes) < MIN_NODES:
            return None
        target = [(f.name, getattr(self.pipeline.target, f.name)) for f in fields(self.pipeline.target)]
        target = [(name, sorted(value) if isinstance(value, frozenset) else value) for name, value in target]
        context = (f"format {FORMAT} cache {CACHE_VERSION} backend {self.pipeline.name} "
                   f"library {flags.LIBRARY} nram {flags.BANG_NRAM} target {target}\n"
                   f"{self.pipeline.cache.identity}\n{code_identity()}")
        digest = graph_digest(graph, context)
        return None if digest is None else os.path.join(self.directory, digest + ".json")

    def save(self, graph, steps, sources):
        """Remember the compiled `steps` (and their kernels' `sources`) for graphs like `graph`."""
        path = self._path(graph)
        if path is None:
            return
        chosen_sets, chosen_index, records = [], {}, []
        for step, source in zip(steps, sources):
            lowering = None
            if step.lowering is not None:
                root, epilogue, prologues, chosen = step.lowering
                if id(chosen) not in chosen_index:
                    chosen_index[id(chosen)] = len(chosen_sets)
                    chosen_sets.append(sorted(chosen))
                lowering = [root, list(epilogue), sorted(prologues), chosen_index[id(chosen)]]
            spec = step.library
            records.append({
                "name": step.name, "blocked": step.blocked, "positions": step.positions,
                "sites": [[kind.__name__, message, position] for kind, message, position in step.sites],
                "library": None if spec is None else [spec.name, spec.subscripts, spec.operand_shapes,
                                                      spec.output_shape, spec.operand_dtype.name],
                "lowering": lowering, "tuned_from": step.tuned_from, "in_place": list(step.in_place),
                "outer": step.outer,
                "key": None if spec is not None else self.pipeline.cache.key(source),
                "source": source})
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_atomic(path, json.dumps({"format": FORMAT, "chosen": chosen_sets, "steps": records}))
        except OSError:         # (a full disk): the store only saves time, the values are computed
            pass

    def load(self, graph):
        """(steps, functions, sources) remembered for graphs like `graph`, or None."""
        path = self._path(graph)
        if path is None:
            return None
        try:
            with open(path) as stream:
                stored = json.load(stream)
            return self._restore(graph, stored)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None

    def _restore(self, graph, stored):
        if stored["format"] != FORMAT:
            return None
        chosen_sets = [frozenset(chosen) for chosen in stored["chosen"]]
        steps, functions, sources = [], [], []
        for record in stored["steps"]:
            positions = record["positions"]
            if not all(type(k) is int and 0 <= k < len(graph.nodes) for k in positions) or \
                    not set(record["in_place"]) <= set(positions[1:]):
                return None
            outer = record["outer"]
            first = graph.nodes[positions[0]].shape[:1]
            if outer is not None and (not first or outer != first[0] or type(outer) is not int):
                return None         # (a run-time extent is the output's first one)
            spec = record["library"]
            if spec is not None:
                name, subscripts, operand_shapes, output_shape, operand_dtype = spec
                spec = LibraryContraction(name, subscripts, [tuple(s) for s in operand_shapes],
                                          tuple(output_shape), dtypes.as_dtype(operand_dtype))
                function, source = library.launcher(spec)
            else:
                function, source = self.pipeline.stored_function(record["key"], record["name"]), \
                    record["source"]
                if function is None:
                    return None
            lowering = record["lowering"]
            if lowering is not None:
                root, epilogue, prologues, chosen = lowering
                lowering = (root, tuple(epilogue), frozenset(prologues), chosen_sets[chosen])
            steps.append(Step.restored(
                record["name"], record["blocked"], positions=record["positions"],
                sites=[(_error_class(kind), text, position) for kind, text, position in record["sites"]],
                library=spec, lowering=lowering, tuned_from=record["tuned_from"],
                in_place=tuple(record["in_place"]), outer=outer))
            functions.append(function)
            sources.append(source)
        return steps, functions, sources


def _error_class(name):
    """The error class a run-time check raises, by name: only metagraph's own."""
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.MetagraphError)):
        raise ValueError(f"a stored schedule names {name!r}, which is not a metagraph error")
    return kind
