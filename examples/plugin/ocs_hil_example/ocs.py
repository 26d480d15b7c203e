"""A switch protocol from a lab's own package: a Polatis unit whose TL1 firmware takes one pair per ENT-PATCH.

The driver is the project's TL1 driver told not to send `&` AID lists; the emulated bench serves it with its
TL1 server (which takes both forms), so `--bench emulated:PROFILE?ocs=example-tl1-single` drives it too.
"""
from devices.ocs.registry import OcsProtocol, register_protocol
from devices.ocs.tl1 import Tl1Switch


class OnePairTl1Switch(Tl1Switch):
    """`apply` sends one ENT-PATCH per new pair."""

    ent_patch_lists = False


register_protocol(OcsProtocol(
    name="example-tl1-single", driver="ocs_hil_example.ocs:OnePairTl1Switch", schemes=("tcp",), default_port=3082,
    line_channel=True, permanent="devices.ocs.tl1:PERMANENT_CODES", emulator="devices.emulated.bench:tl1_view",
    summary="Polatis TL1 over TCP, one pair per ENT-PATCH (example plugin)"))
