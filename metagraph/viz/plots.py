"""Pictures drawn with matplotlib (the `examples` extra), imported only when one is drawn:
a profile's timeline from its Trace Event Format file (`timeline`, also `python -m metagraph.viz
trace.json out.png`) and training curves (`curves`, what the examples' --plot writes). Figures
are made without pyplot, so no window opens and no global state changes."""
import json

from metagraph.errors import ArgumentError, MetagraphError

COLOURS = {"kernel": "#4c72b0", "kernel (backward)": "#64b5cd", "compile": "#dd8452", "load": "#55a868",
           "schedule": "#c44e52", "realise": "#bbbbbb", "collective": "#8172b3", "transfer": "#937860"}
OTHER_COLOUR = "#999999"
LABELLED_SHARE = 0.04      # events at least this share of the timeline are labelled with their name
LABEL_POINTS = 6
FIGURE_WIDTH, PLOT_WIDTH = 11, 9.3      # inches: the figure's, and its plot's inside it


def require_matplotlib():
    """Raise a MetagraphError saying how to install matplotlib unless it can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MetagraphError("plotting needs matplotlib: pip install 'metagraph[examples]' "
                             "(or pip install matplotlib)") from None


def _figure(width, height):
    """A matplotlib Figure that draws without pyplot (no window, no global state)."""
    require_matplotlib()
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def curves(path, panels, xlabel="epoch", title=None):
    """Plot training curves to `path` (PNG, SVG, PDF): `panels` maps a panel's y label ("loss") to
    its curves, each a label ("train") mapped to (x, y) points. Returns `path`."""
    if not panels or not all(isinstance(curves, dict) for curves in panels.values()):
        raise ArgumentError("viz.curves: panels must map a y label to {curve label: [(x, y), ...]}")
    figure = _figure(6.4, 2.4 * len(panels) + 0.4)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (ylabel, lines) in zip(axes, panels.items()):
        for label, points in lines.items():
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=label)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[-1].set_xlabel(xlabel)
    if title:
        figure.suptitle(title)
    figure.savefig(path, dpi=110)
    return path


def timeline(trace, path, title=None):
    """Draw a trace (a path to `export_chrome_trace`'s JSON, or its dict) to `path`: one row per
    thread, one bar per complete event, coloured by category (the backward pass's kernels apart),
    realisations as a thin bar beneath. Returns `path`."""
    if not isinstance(trace, dict):
        with open(trace) as stream:
            trace = json.load(stream)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        raise ArgumentError("viz.timeline: the trace has no complete (\"ph\": \"X\") events")
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    threads = list(dict.fromkeys(e["tid"] for e in events))
    row = {thread: k for k, thread in enumerate(threads)}
    figure = _figure(FIGURE_WIDTH, 1.2 + 0.9 * len(threads))
    ax = figure.subplots()
    start = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - start
    seen = {}
    for event in sorted(events, key=lambda e: -e["dur"]):      # long events first: short ones on top
        category = _category(event)
        seen[category] = COLOURS.get(category, OTHER_COLOUR)
        realise = category == "realise"
        y, height = row[event["tid"]] + (0.38 if realise else 0.0), 0.12 if realise else 0.6
        x, width = (event["ts"] - start) / 1e3, event["dur"] / 1e3
        ax.broken_barh([(x, width)], (y - height / 2, height), facecolors=seen[category],
                       edgecolor="white", linewidth=0.3)
        if event["dur"] >= span * LABELLED_SHARE and not realise:       # as many characters as fit
            fitting = int(event["dur"] / span * PLOT_WIDTH * 72 / (LABEL_POINTS * 0.62))
            ax.text(x + width / 2, y, event["name"][:fitting], ha="center", va="center",
                    fontsize=LABEL_POINTS, clip_on=True)
    ax.set_yticks(range(len(threads)), [names.get(t, str(t)) for t in threads])
    ax.set_ylim(len(threads) - 0.4, -0.5)
    ax.set_xlabel("ms from the start of the profile")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colour, label=category) for category, colour in sorted(seen.items())],
              loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / len(threads)), fontsize=8,
              ncols=len(seen), frameon=False)
    ax.set_title(title or f"{sum(e.get('cat') == 'kernel' for e in events)} kernel launches")
    figure.savefig(path, dpi=110)
    return path


def _category(event):
    """An event's category, the backward pass's kernels apart from the others."""
    category = event.get("cat", "")
    if category == "kernel" and "_backward" in event.get("args", {}).get("ops", ""):
        return "kernel (backward)"
    return category
