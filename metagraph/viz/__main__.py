"""`python -m metagraph.viz TRACE.json OUT.png`: draw the timeline of a trace that
`Profile.export_chrome_trace` wrote (matplotlib, the `examples` extra)."""
import sys

from metagraph.viz.plots import timeline


def main(argv=None):
    """Draw the timeline of argv's trace file to its image path; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(timeline(args[0], args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
