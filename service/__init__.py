"""The inference service: FastAPI on onnxruntime, /classify and /embed. Never imports torch.

Where a request goes, module by module:

- :mod:`service.cli` (``smso-serve``) reads :mod:`service.settings` (``SMSO_*`` variables and
  flags) and runs uvicorn with the header and body deadlines of :mod:`service.connections` and
  the SIGTERM draining of :mod:`service.drain`; with ``--workers`` and a shared session it
  starts :mod:`service.host_process` (the loop of :mod:`service.session_host`) first.
- :mod:`service.app` assembles the app. Its layers, outermost first: :mod:`service.access`
  (request id, access line, the request's span of :mod:`service.tracing`), Starlette's error
  layer, ``CloseWhenDraining`` (:mod:`service.drain`), :mod:`service.metrics`,
  :mod:`service.bodies` (the bytes held in request bodies), :mod:`service.disconnect` (a client
  that left stops its work). :mod:`service.exchange` is what a request ended with, for them.
- The routes: :mod:`service.routes` (``/classify``, ``/embed``, ``/metadata``, health,
  ``/metrics``), :mod:`service.oip` with :mod:`service.oip_codec` (the Open Inference Protocol,
  ``/v2``) and :mod:`service.grpc_server` (the same protocol over gRPC), with
  :mod:`service.dependencies` (state, API key), :mod:`service.schemas`, :mod:`service.errors`
  (every error as JSON) and :mod:`service.docs` (``/docs``, offline).
- :mod:`service.inputs` reads the uploaded images; :mod:`service.pipeline` decodes them off the
  event loop (:mod:`service.images` with Pillow, or on the GPU :mod:`service.gpu_jpeg` with
  :mod:`service.jpeg_header` and :mod:`service.preprocess_graph`; :mod:`service.admission`
  bounds how many at once) and queues them on the model's :mod:`service.batcher`.
- The batcher's inference thread runs each batch through the model's :mod:`service.backend`
  (:mod:`service.runner`: batch-size buckets, IO binding, CUDA graphs; :mod:`service.providers`:
  the execution providers), or in a worker with a shared session :mod:`service.hosted_backend`;
  :mod:`service.stage_clock` times its stages. :mod:`service.typicality` scores the embeddings
  and :mod:`service.drift` watches the scores.
- The models: :mod:`service.card` (the model card in the ONNX file), :mod:`service.loader` (load,
  warm up, retire), :mod:`service.registry` (the models served, by name and version),
  :mod:`service.repository` (a model repository in Triton's layout, kept in step with the disk).
- Spans leave the process through :mod:`service.span_export` (with :mod:`service.span_encoding`
  and :mod:`service.span_limits`); :mod:`service.logs` formats the log.
"""
