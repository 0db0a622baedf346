"""``smso-embed``: an exported model run over a whole collection of images on Ray Data, into
Parquet, with the service's own decoding, onnxruntime session and answers (never torch).

Modules, in the order a job uses them:

- :mod:`batch.cli`: the command, its flags, its one-line errors and exit status;
- :mod:`batch.inputs`: INPUT (a folder, a glob, a Parquet/CSV list) as a sorted list of URIs;
- :mod:`batch.walk`: a local folder walked without leaving it (links, loops, FIFOs), and a file
  opened only if it is a regular one;
- :mod:`batch.model`: MODEL read once by the driver, checked, its file's and card's checksums;
- :mod:`batch.lock`: OUT held by one job at a time (a lock the kernel gives back if it dies);
- :mod:`batch.job`: Ray started or joined, the Ray Data pipeline and how it uses the CPUs;
- :mod:`batch.embedder`: the decode tasks and the inference actors (the service's modules);
- :mod:`batch.outputs`: OUT's two tables written exactly once, the manifest, the resume scan;
- :mod:`batch.progress` and :mod:`batch.summary`: what the job says while it runs and at its end.

docs/batch.md is the user's guide: reading the tables back, a cluster, the speed measured.
"""
