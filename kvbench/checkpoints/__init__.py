"""Checkpoints that kvbench makes or inspects without a hub: shape twins of published models
(:mod:`kvbench.checkpoints.shape`) and weight fingerprints read from the checkpoint files
(:mod:`kvbench.checkpoints.files`)."""
