"""Traces: canonical schemas, importers, seeded generators and timed replay (see docs/traces.md).

The names below are loaded on first use (PEP 562): importing `traces.errors` — which every CLI start-up does
through `harness.errors` — must not pull in pandas and scipy.
"""
from __future__ import annotations

import importlib

_WHERE = {"TraceFormatError": "traces.errors",
          "diloco_sync_windows": "traces.generate", "generate_moe": "traces.generate",
          "mmpp_arrivals": "traces.generate", "poisson_arrivals": "traces.generate",
          "MoePhase": "traces.moe", "load_moe": "traces.moe", "moe_phases": "traces.moe",
          "load_requests": "traces.requests", "load_sync_windows": "traces.requests",
          "MOE_PHASES": "traces.schema", "MoeHeader": "traces.schema", "MoeTrace": "traces.schema",
          "write_moe": "traces.schema", "write_requests": "traces.schema", "write_sync_windows": "traces.schema"}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
