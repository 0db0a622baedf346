"""onnxruntime: execution providers, sessions and how a batch runs through them, in this
process or in the session host shared by the workers, and the model card checked against the
graph."""
