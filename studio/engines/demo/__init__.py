"""The embedded demo engine: procedural motion and a procedural avatar, no checkpoints."""
