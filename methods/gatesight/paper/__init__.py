"""``kvbench paper``: every table and figure of the GateSight paper from one command, beside the paper's numbers.

Pure data and functions (importing them loads no torch):

* :mod:`.numbers` — the paper's numbers (``paper_numbers.json``, transcribed once) and its stated findings,
  each finding a machine-checkable rule over measured values;
* :mod:`.artifacts` — the artifact map: each table / figure -> the grids behind it at ``--scale tiny`` and
  ``--scale paper``, or the reason it is not reproducible there;
* :mod:`.estimate` — the dry run's counts and estimated time from measured per-context costs;
* :mod:`.verdicts` — held / did not hold / not measurable, with the numbers that decide it;
* :mod:`.measure` — measured values from a results store, a cost file and GateSight evaluations.

:mod:`.stages` runs the grids (torch), :mod:`.page` renders ``paper.md``, ``index.html`` and the figures.
"""
