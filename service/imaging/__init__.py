"""Encoded image bytes to the model's input tensor: on the CPU with Pillow, or JPEGs on the
GPU with nvImageCodec."""
