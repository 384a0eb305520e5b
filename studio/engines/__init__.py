"""The talking-head engines (demo, Ditto) behind one interface: motion for a clip, and a
renderer of its frames."""
