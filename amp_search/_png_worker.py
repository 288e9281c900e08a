"""The process that draws `amp-search timeline --png` (amp_search.timeline.PngWriter).

It imports matplotlib as soon as it starts, while the parent process is still planning, then
reads one pickled drawing job from stdin and writes the PNG with
`amp_search.timeline.write_gantt_png`. Exit status 0 when written (or when stdin closes
without a job), 1 with one line on stderr when it cannot be. Internal: no arguments.
"""
from __future__ import annotations

import pickle
import sys


def main() -> int:
    import matplotlib.backends.backend_agg  # noqa: F401  (the slow part: overlaps the plan)
    import matplotlib.collections  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.patches  # noqa: F401

    from amp_search.timeline import write_gantt_png

    data = sys.stdin.buffer.read()
    if not data:
        return 0
    job = pickle.loads(data)
    try:
        write_gantt_png(job["sim"], job["path"], title=job["title"],
                        stage_names=job["stage_names"])
    except OSError as exc:
        print(exc.strerror or str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
