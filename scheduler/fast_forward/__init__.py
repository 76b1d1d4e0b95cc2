"""Decode stretches: the steps a scheduler can take at once when the driver knows every sampled token (the simulator). docs/fast-forward.md says why they equal stepping."""
