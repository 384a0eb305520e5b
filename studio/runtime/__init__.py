"""Runtime backends, checkpoint discovery and engine caches."""
