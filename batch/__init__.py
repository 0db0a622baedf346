"""``smso-embed``: an exported model run over a whole collection of images into Parquet, with
the service's own decoding, onnxruntime session and answers (never torch), in one process or on
Ray Data; ``smso-index``: what it wrote, as a gallery of nearest neighbours (:mod:`gallery`).

Modules, in the order a job uses them:

- :mod:`batch.cli`: the command, its flags, its one-line errors and exit status, the engine;
- :mod:`batch.inputs`: INPUT (a folder, a glob, a Parquet/CSV list) as a sorted list of URIs;
- :mod:`batch.walk`: a local folder walked without leaving it (links, loops, FIFOs), and a file
  opened and read only if it is a regular one;
- :mod:`batch.model`: MODEL read once, checked, its file's and card's checksums;
- :mod:`batch.lock`: OUT held by one job at a time (a lock the kernel gives back if it dies);
- :mod:`batch.outputs`: OUT's layout, its tables' schemas, the manifest, the resume scan;
- :mod:`batch.plan`: INPUT now against OUT: new, changed, deleted, retried images;
- :mod:`batch.job`: one run, whichever engine: chunks, the part writer, the check at the end;
- :mod:`batch.engine`: what an engine is given and says it did;
- :mod:`batch.local_engine`: the embedded engine (threads, no Ray; the default);
- :mod:`batch.ray_engine`: the Ray Data engine (``--engine ray``, ``--address``; the only module
  that imports Ray);
- :mod:`batch.decoding` and :mod:`batch.embedder`: the stages both engines run;
- :mod:`batch.parts`: each chunk of images written whole, once; rows taken out of a part;
- :mod:`batch.stages`, :mod:`batch.progress` and :mod:`batch.summary`: each stage's time, what
  the job says while it runs and at its end;
- :mod:`batch.arg_types`: the argparse converters both commands' flags share.

``smso-index``:

- :mod:`batch.index_cli`: the command, its flags, its summary;
- :mod:`batch.gallery_rows`: OUT folders' embeddings as a gallery's rows, stamp and classes;
- :mod:`batch.duplicates`: the gallery's near-duplicate pairs, into Parquet.

docs/batch.md is the user's guide: reading the tables back, the engines, a cluster, the speed;
docs/search.md the gallery's.
"""
