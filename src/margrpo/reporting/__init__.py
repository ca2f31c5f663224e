"""Tables (pandas -> CSV / Markdown / LaTeX) and figures (matplotlib) from result files only.

``results`` reads what the other stages wrote and aggregates over seeds; ``selection`` picks the
checkpoint a run reports; ``tables`` builds Tables 1 and 2; ``figures`` builds Figs. 2, 4, 6, 7;
``paired`` the paired differences of runs and their intervals, ``claims`` the paper's claims decided
with them, ``claims_markdown`` their report; ``related`` Table 3 and the wall-clock figure of the
related methods (issue #19).
Submodules are imported on use (``from margrpo.reporting import tables``), so reading a
selection does not import matplotlib.
Layer 6 (see margrpo/__init__.py): it must not import experiment, stages, plan, cli.
"""
