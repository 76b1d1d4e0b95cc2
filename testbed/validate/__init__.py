"""testbed validate: how far to trust the simulator, against measured serving points."""
