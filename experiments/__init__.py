"""Studies of the model's behaviour, each a script run as ``python -m experiments.NAME``.

Where ``bench/`` measures speed and cost, these measure what the served scores say: their
separation of in- and out-of-distribution images, against baselines, with confidence intervals.
They drive the real server through ``bench.lib`` (the launcher, the load driver, the report
writer) and write their JSON beside the benchmarks', under ``bench/results/``.

* :mod:`experiments.typicality`: the served typicality score's out-of-distribution AUROC, its
  drift alarms and its cost (``docs/results/typicality.md``);
* :mod:`experiments.typicality_confirm`: the confirmatory evaluation on sets the score was not
  designed on (``docs/results/typicality-confirmation.md``, ``make typicality-confirm``);
* :mod:`experiments.auroc`: AUROCs of several scores and DeLong's test of their differences;
* :mod:`experiments.confirm_sets`: the confirmation's image sets (typeset glyphs, corruptions).
"""
