"""einsum: each pairwise contraction is reduce_add(mul(reindex(a), reindex(b))), as matmul.

The equation is parsed by hand into one label per operand dimension: a letter, or an int for a
dimension covered by an ellipsis (right-aligned across operands, so they broadcast as NumPy's).
A repeated letter within one operand is a diagonal view; a label only one operand has and the
output lacks is summed out of that operand first; then operands are contracted two at a time,
in a greedy order (the pair whose loop nest is smallest first, ties left to right). Each step
views both operands over one loop (kept labels, then summed ones) and reduces the summed axes,
so the compiler sees the same contraction as a (batched) matmul and register-tiles it.
"""
from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.expr import Const, Var
from metagraph.amp.autocast import cast_arguments
from metagraph.ops import math as m
from metagraph.ops.linalg import contract
from metagraph.ops.movement import view
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"   # sublist ints 0..51, in order


def einsum(*args):
    """PyTorch's einsum: `einsum('ij,jk->ik', a, b)`, `einsum('ij,jk', [a, b])`, or the sublist
    form `einsum(a, [0, 1], b, [1, 2], [0, 2])` (ints 0-51 and `...`)."""
    if not args:
        fail(ArgumentError, "einsum", "expected an equation and operands, got nothing")
    if isinstance(args[0], str):
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        return _einsum(args[0], *operands)
    return _einsum(*_from_sublists(args))


def _from_sublists(args):
    """(equation, *operands) from einsum's sublist form."""
    pairs = len(args) // 2
    operands = args[0:2 * pairs:2]
    equation = ",".join(_sublist(s) for s in args[1:2 * pairs:2])
    if len(args) % 2:                                    # the output's sublist comes last
        equation += "->" + _sublist(args[-1])
    return (equation,) + tuple(operands)


def _sublist(sublist):
    if not isinstance(sublist, (list, tuple)):
        fail(ArgumentError, "einsum", f"expected a list of subscripts, got {type(sublist).__name__}")
    text = ""
    for s in sublist:
        if s is Ellipsis:
            text += "..."
        elif isinstance(s, int) and not isinstance(s, bool) and 0 <= s < len(_LETTERS):
            text += _LETTERS[s]
        else:
            fail(ArgumentError, "einsum", f"subscripts in the sublist form must be integers in [0, 52) "
                                          f"or ..., got {s!r}")
    return text


@recorded
def _einsum(equation, *operands):
    """einsum of an equation string (see the module docstring for the order of contractions)."""
    if len(operands) > 1:           # a contraction: PyTorch's runs as bmm, on autocast's list
        operands, _ = cast_arguments("einsum", operands, None)
    problem = _Problem(equation, operands)
    terms = [problem.diagonal(x, labels) for x, labels in zip(operands, problem.inputs)]
    while len(terms) > 1:
        # a label that only this term has and the output lacks is summed out of it first
        terms = [_contract([term], [label for label in term[1]
                                    if _needed(label, term, terms, problem.output)]) for term in terms]
        i, j = min(((i, j) for i in range(len(terms)) for j in range(i + 1, len(terms))),
                   key=lambda pair: (_loop_size([terms[pair[0]], terms[pair[1]]]), pair))
        a, b = terms[i], terms[j]
        rest = terms[:i] + terms[i + 1:j] + terms[j + 1:]
        keep = problem.output
        if rest:
            keep = [label for label in _union(a[1], b[1])
                    if label in problem.output or any(label in term[1] for term in rest)]
        terms = rest[:i] + [_contract([a, b], keep)] + rest[i:]
    return _contract(terms, problem.output)[0]


def _needed(label, term, terms, output):
    """Whether a label must survive past this term: the output or another term has it."""
    return label in output or any(label in other[1] for other in terms if other is not term)


def _union(a, b):
    return list(a) + [label for label in b if label not in a]


def _sizes(terms):
    """Each label's size over the (node, labels) terms: the largest (a size 1 broadcasts)."""
    sizes = {}
    for node, labels in terms:
        for size, label in zip(node.shape, labels):
            sizes[label] = max(size, sizes.get(label, 1))
    return sizes


def _loop_size(terms):
    total = 1
    for size in _sizes(terms).values():
        total *= size
    return total


def _contract(terms, keep):
    """The terms (one or two (node, labels) pairs) multiplied and summed over every label not in
    `keep`; the result's dimensions are `keep`, in order."""
    labels = _union(*[term[1] for term in terms]) if len(terms) == 2 else list(terms[0][1])
    if len(terms) == 1 and labels == list(keep):
        return terms[0]
    loop = list(keep) + [label for label in labels if label not in keep]
    sizes = _sizes(terms)
    shape = tuple(sizes[label] for label in loop)
    views = []
    for node, own in terms:
        index_map = [Var(loop.index(label)) if size == sizes[label] else Const(0)
                     for size, label in zip(node.shape, own)]
        views.append(view(node, shape, index_map))
    axes = tuple(range(len(keep), len(loop)))
    if len(views) == 2 and axes:
        return contract(views[0], views[1], axes), tuple(keep)
    product = views[0] if len(views) == 1 else m.mul(views[0], views[1])
    if axes:
        product = apply("reduce", product, op="add", axes=axes, keepdim=False)
    return product, tuple(keep)


class _Problem:
    """An equation checked against its operands: one label per operand dimension, the output's
    labels, and every label's size."""

    def __init__(self, equation, operands):
        self.equation, self.operands = equation, operands
        if not operands:
            self.error(ArgumentError, "must provide at least one operand")
        for k, x in enumerate(operands):
            if not m.is_node(x):
                self.error(ArgumentError, f"operand {k} is a {type(x).__name__}, not a tensor")
            if x.dtype != operands[0].dtype:
                self.error(DTypeError, f"operands need the same dtype, got {operands[0].dtype.name} "
                                       f"(operand 0) and {x.dtype.name} (operand {k})")
        if operands[0].dtype == dtypes.bool_:
            self.error(DTypeError, "bool operands are not supported")
        text = equation.replace(" ", "")
        left, arrow, right = text.partition("->")
        terms = left.split(",")
        if len(terms) != len(operands):
            more = "more" if len(operands) > len(terms) else "fewer"
            self.error(ArgumentError, f"{more} operands ({len(operands)}) were provided than the "
                                      f"equation specifies ({len(terms)})")
        parsed = [self.subscripts(term, f"operand {k}") for k, term in enumerate(terms)]
        covered = [x.ndim - len(letters) for x, (letters, dots) in zip(operands, parsed) if dots is not None]
        ellipsis = max(covered, default=0)
        self.inputs = [self.labelled(x, letters, dots, ellipsis, k)
                       for k, (x, (letters, dots)) in enumerate(zip(operands, parsed))]
        self.sizes = self.label_sizes()
        if arrow:
            letters, dots = self.subscripts(right, "the output")
            self.output = self.output_labels(letters, dots, ellipsis)
        else:
            counts = {}
            for letters, _ in parsed:
                for letter in letters:
                    counts[letter] = counts.get(letter, 0) + 1
            self.output = list(range(ellipsis)) + sorted(letter for letter, n in counts.items() if n == 1)

    def error(self, kind, message):
        shapes = ", ".join(str(x.shape) if m.is_node(x) else type(x).__name__ for x in self.operands)
        fail(kind, "einsum", f"{self.equation!r} with operand shapes [{shapes}]: {message}")

    def subscripts(self, term, whose):
        """(letters, position of the ellipsis among them or None) of one term."""
        letters, dots, k = [], None, 0
        while k < len(term):
            if term.startswith("...", k):
                if dots is not None:
                    self.error(ArgumentError, f"{whose} has more than one ellipsis")
                dots, k = len(letters), k + 3
                continue
            if term[k] == ".":
                self.error(ArgumentError, f"found '.' in {whose} that is not part of an ellipsis (...)")
            if term[k] not in _LETTERS:
                self.error(ArgumentError, f"invalid subscript {term[k]!r} in {whose}; subscripts must "
                                          "be letters in [a-zA-Z]")
            letters.append(term[k])
            k += 1
        return letters, dots

    def labelled(self, x, letters, dots, ellipsis, k):
        """One label per dimension of operand k: its letters, with ints for the ellipsis's
        dimensions (right-aligned, so that they broadcast)."""
        if dots is None:
            if x.ndim != len(letters):
                self.error(ShapeError, f"operand {k} has {x.ndim} dimensions but {len(letters)} "
                                       "subscripts and no ellipsis")
            return list(letters)
        covered = x.ndim - len(letters)
        if covered < 0:
            self.error(ShapeError, f"operand {k} has {x.ndim} dimensions, fewer than its "
                                   f"{len(letters)} subscripts")
        return letters[:dots] + list(range(ellipsis - covered, ellipsis)) + letters[dots:]

    def label_sizes(self):
        """Every label's size: equal where a label repeats within an operand; across operands a
        size 1 broadcasts."""
        sizes = {}
        for k, (x, labels) in enumerate(zip(self.operands, self.inputs)):
            own = {}
            for size, label in zip(x.shape, labels):
                name = label if isinstance(label, str) else "... dimension"
                if own.setdefault(label, size) != size:
                    self.error(ShapeError, f"subscript {name} is repeated in operand {k} with sizes "
                                           f"{own[label]} and {size}; a diagonal needs equal sizes")
                seen = sizes.get(label, 1)
                if seen != 1 and size not in (1, seen):
                    self.error(ShapeError, f"subscript {name} has size {size} in operand {k}, which does "
                                           f"not broadcast with the size {seen} seen before")
                sizes[label] = max(seen, size)
        return sizes

    def output_labels(self, letters, dots, ellipsis):
        output = list(letters) if dots is None else letters[:dots] + list(range(ellipsis)) + letters[dots:]
        for letter in letters:
            if letters.count(letter) > 1:
                self.error(ArgumentError, f"output subscript {letter} appears more than once")
            if letter not in self.sizes:
                self.error(ArgumentError, f"output subscript {letter} appears in no input operand")
        return output

    def diagonal(self, x, labels):
        """(x viewed with one dimension per distinct label, those labels): a repeated label reads
        the diagonal."""
        distinct = list(dict.fromkeys(labels))
        if len(distinct) == len(labels):
            return x, tuple(labels)
        shape = tuple(x.shape[labels.index(label)] for label in distinct)
        return view(x, shape, [Var(distinct.index(label)) for label in labels]), tuple(distinct)
