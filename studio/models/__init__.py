"""Ditto's six networks as torch modules that load the released checkpoints unchanged."""
