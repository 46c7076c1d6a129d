"""``kvbench run``: the protocol loop and its parts, one idea each. Import a name from the module that defines it.

Its public face:

* :mod:`kvbench.run.plan`: what a run is asked (:class:`~kvbench.run.plan.RunConfig`), the one check made before
  any model loads (:func:`~kvbench.run.plan.validate`, returning the plan) and what a run reports back
  (:class:`~kvbench.run.plan.RunSummary`);
* :mod:`kvbench.run.loop`: the loop itself, :func:`~kvbench.run.loop.run` (one model) and
  :func:`~kvbench.run.loop.run_models` (several, one after another), and
  :func:`~kvbench.run.loop.make_engine`.

Its parts: the shard's contexts (:mod:`kvbench.run.shards`), the manifest entry (:mod:`kvbench.run.manifest`), the
methods' artifacts (:mod:`kvbench.run.artifacts`), the state the contexts share (:mod:`kvbench.run.state`),
scoring, forking and answering (:mod:`kvbench.run.answer`), the answer pool (:mod:`kvbench.run.pool`) and the
progress bar (:mod:`kvbench.run.progress`).
"""
