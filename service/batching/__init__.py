"""The micro-batcher: images from many requests gathered into one inference call."""
