"""Training: SMSO pooling, the paper's baselines and backbones, and the models built from them.

The modules, from the layer up to the command lines:

- The maths: :mod:`training.second_order` (covariances of feature maps),
  :mod:`training.chi2_transforms` (chi-squared to standard normal), :mod:`training.heads` (SMSO
  and every baseline, one registry).
- The model: :mod:`training.backbones` (the trunks, with torchvision's or a local file's weights)
  and :mod:`training.model` (backbone -> 1x1 conv -> BatchNorm -> head -> classifier).
- The data: :mod:`training.datasets` (the paper's datasets in their published layouts,
  Fashion-MNIST, an image folder; the presets).
- A run: :mod:`training.config` (the run's settings), :mod:`training.runtime` (device, mixed
  precision, DDP), :mod:`training.train` (``smso-train``) with :mod:`training.engine` (the epoch
  and evaluation loops), :mod:`training.progress`, :mod:`training.divergence` (a loss that
  explodes stops the run) and :mod:`training.checkpoint`; at its end
  :mod:`training.head_statistics` and :mod:`training.recalibrate` (``smso-recalibrate``)
  re-estimate SMSO's Sigma, and :mod:`training.ship` copies a run into ``models/``.
- After a run: :mod:`training.evaluate` (``smso-eval``), :mod:`training.figures`
  (``smso-figure``), :mod:`training.experiments` (``smso-experiment``: the paper's tables as
  named rows) with :mod:`training.paired_comparison` (rows compared seed by seed),
  :mod:`training.recipe_sweep` (each head's recipe chosen on validation, the fair table;
  both behind :mod:`training.experiment_cli`) and
  :mod:`training.json_lines` (the files runs write).
- :mod:`training.cli`: what the console scripts share (a user's mistake is one line, exit 2;
  the ``--help`` of :mod:`training.help_formatter`, which the run's settings use too),
  with :mod:`training.outputs` (every output checked before any work and written atomically)
  and :mod:`training.torch_files` (files ``torch.save`` wrote, read as data only, with one line
  saying why one cannot be).
"""
