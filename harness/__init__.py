"""The harness: CLI, playbook and inventory loading, runner, clock correction, event log and run records."""
__version__ = "0.1.0"
