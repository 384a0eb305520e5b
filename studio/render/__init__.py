"""The compositions of the stages (a clip) and the one place that opens an engine."""
