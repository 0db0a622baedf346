"""Export: trace a trained SMSO checkpoint to a verified ONNX file with its model card.

:mod:`export.cli` (``smso-export``) calls :mod:`export.onnx_export`, which traces the module of
:mod:`export.graph` (the model in eval mode, its SMSO head folded into the 1x1-conv + l2-pool
form or the covariance form), checks the file against PyTorch (:mod:`export.parity`), fits the
typicality reference (:mod:`export.typicality`) and adds its score to the graph
(:mod:`export.typicality_graph`), and writes the model card (:class:`modelcard.card.ModelCard`)
into the file; :mod:`export.card` reads it back and checks the served name before any work.
"""
