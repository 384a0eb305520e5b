"""Talking-head preview studio: Ditto synthesis with pose smoothing, adaptive cadence and export."""

__version__ = "0.1.0"
