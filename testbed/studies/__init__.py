"""Studies of many replays: sweeps over a grid of options, capacity search, and where their
points run (local processes or Ray); `testbed sweep` and `testbed capacity`."""
