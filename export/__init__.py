"""Export: trace a trained SMSO checkpoint to a verified ONNX file with its model card."""
