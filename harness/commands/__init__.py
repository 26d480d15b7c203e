"""One module per sub-command; see harness.cli."""
