"""The host agent shipped to each host (hilagent.py), its content-addressed install path, and the probe
frame template the harness builds for it with scapy."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

AGENT_FILE = Path(__file__).resolve().parent / "hilagent.py"
INSTALL_DIR = "~/.cache/ocs-hil"
PROBE_UDP_SPORT = 49152  # fixed: one flow per probe stream


@lru_cache(maxsize=1)
def agent_source() -> str:
    """The agent program's text, exactly as it is uploaded."""
    return AGENT_FILE.read_text(encoding="utf-8")


def agent_digest() -> str:
    return hashlib.sha256(agent_source().encode("utf-8")).hexdigest()[:12]


def agent_path() -> str:
    """Remote install path: `~/.cache/ocs-hil/hilagent-<sha256[:12]>.py`, so versions never collide."""
    return f"{INSTALL_DIR}/hilagent-{agent_digest()}.py"


def build_probe_template(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, udp_port: int = 4791,
                         dqpn: int = 1) -> bytes:
    """A full RoCEv2 probe frame (Ether/IPv4/UDP/BTH RC SEND_ONLY/16 zero bytes/ICRC), PSN 0, built by
    scapy. The agent patches PSN, payload (seq, tx_ns) and ICRC per packet."""
    from scapy.contrib.roce import BTH, opcode
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    send_only = opcode("RC", "SEND_ONLY")[0]  # opcode() returns (code, name)
    frame = (Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, id=1, ttl=64, tos=0, flags=0)
             / UDP(sport=PROBE_UDP_SPORT, dport=udp_port, chksum=0)
             / BTH(opcode=send_only, pkey=0xFFFF, dqpn=dqpn, psn=0) / Raw(b"\0" * 16))
    return bytes(frame)
