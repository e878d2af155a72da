"""How the formats' chains run: harness.executors.base (the interface), .registry (by name), .local, .ray."""
