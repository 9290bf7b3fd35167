"""Trainer -> engine weight hand-off and model checkpoints (see docs/architecture.md, "Weights")."""
