"""Training: SMSO pooling, the paper's baselines and backbones, and the models built from them."""
