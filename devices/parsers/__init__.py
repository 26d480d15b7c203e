"""Pure parsers of host tool output (sysfs, iproute2, rdma, ethtool, mlxlink, nvidia-smi, chrony, date).

Each parser takes text and returns small frozen dataclasses; malformed text raises `ParseError`
(a ValueError) naming what was expected.
"""
from devices.parsers.common import ParseError

__all__ = ["ParseError"]
