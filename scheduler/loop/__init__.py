"""The one event loop that both clocks drive, its arrival sources, its step log, and the logical clock the conformance harness uses."""
