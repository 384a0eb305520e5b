"""The studio window's widgets: viewer, timeline, plots, controls, metrics."""
