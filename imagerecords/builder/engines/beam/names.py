"""Which Beam runner names can run here: checked by build() and the flags before anything starts,
without importing the engine (imports apache_beam only, inside the call)."""

from __future__ import annotations

import difflib
import importlib.util
from typing import Optional

# Prism ships as a runner from this release on; before it, Beam downloads a binary at run time.
PRISM_MIN_BEAM = (2, 68)


def runner_problem(runner: str) -> Optional[str]:
    """Why Beam cannot run `runner` here (the text after the runner's name), or None: a short name
    Beam does not know (with the nearest known one), a dotted path whose module is not installed,
    or PrismRunner on a Beam older than it. Checked before anything is read, by build() and by the
    command alike: otherwise each fails only once the build has started."""
    # Beam: 1.2 s to import; every build's options import this module, a local one never runs Beam
    import apache_beam
    from apache_beam.options.pipeline_options import StandardOptions

    if "." in runner:
        module = runner.rsplit(".", 1)[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package is missing, or the name is malformed
            found = False
        if found:
            return None
        return (f"no module {module} to import the runner from; give a runner name "
                f"({', '.join(StandardOptions.KNOWN_RUNNER_NAMES)}) or the dotted path of an installed "
                "PipelineRunner subclass")
    name = runner.lower()
    if name in ("prism", "prismrunner"):
        version = tuple(int(p) for p in apache_beam.__version__.split(".")[:2] if p.isdigit())
        if version < PRISM_MIN_BEAM:
            return (f"needs apache-beam {'.'.join(map(str, PRISM_MIN_BEAM))} or newer, and this environment has "
                    f"{apache_beam.__version__} (the version constraints.txt pins for Flink); install "
                    f"'apache-beam>={'.'.join(map(str, PRISM_MIN_BEAM))}' in an environment of its own for Prism")
        return None
    known = {path.rsplit(".", 1)[-1].lower() for path in StandardOptions.ALL_KNOWN_RUNNERS} | {"pythonrpcdirectrunner"}
    if name in known or name + "runner" in known:
        return None
    names = list(StandardOptions.KNOWN_RUNNER_NAMES)
    close = difflib.get_close_matches(runner, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"no such Beam runner{hint}; known runners: {', '.join(names)}, or the dotted path of a "
            "PipelineRunner subclass")
