"""The build's lifecycle above the stages: session.py (check → claim → lock → engine → verdict →
commit; build(), finish()), checks.py (the output's pre-flight checks), options.py (BuildOptions),
engines/ (the local engine, and Beam runners over transforms/), memory_arrays.py (build_arrays).
Imports pipeline/ (the stages) and transforms/; nothing below imports it."""
