"""``smso-serve`` side by side with LitServe, BentoML, NVIDIA PyTriton and Ray Serve.

``python -m bench.peers`` (:mod:`bench.peers.__main__`; ``make bench-peers`` first creates the
peers' environment, ``.venv-peers``, from ``bench/peers/requirements.txt``) runs every server on
the same model file, the same preprocessing (the service's own, :mod:`service.imaging`) and
the same onnxruntime session options, with the same batching where a peer has it, checks
that all answer the same best class before timing, then times them in interleaved rounds.

* :mod:`bench.peers.setups`: the servers as run, sent uploads and read (the service's env);
* :mod:`bench.peers.compare`: parity, rounds, ratios and tables, apart from any server;
* :mod:`bench.peers.model`: what every peer server runs (imaging, session, top 5; the stand-in);
* one module per peer, each run in the peers' environment only: :mod:`~.litserve_server`,
  :mod:`~.bentoml_service`, :mod:`~.pytriton_server`, :mod:`~.rayserve_app`.
"""
