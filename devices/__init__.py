"""Bench devices: resource records (where a device is), protocol ABCs and drivers (how to talk to it).

`devices` never imports `harness`. Drivers do not know whether their peer is an emulator.
"""
