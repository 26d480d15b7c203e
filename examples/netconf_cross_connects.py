#!/usr/bin/env python3
"""Drive a Polatis switch's cross-connects over NETCONF with plain ncclient, as a lab user would.

    python examples/netconf_cross_connects.py HOST PORT USER [--known-hosts FILE] [--connect IN:OUT ...]
                                              [--delete IN ...]

The password comes from $OCS_PASSWORD. It lists the cross-connects (get-config on running), applies the
requested changes in one edit-config (pair merge / delete, optical-switch YANG), lists them again and
prints the optical power of the ports it touched (get on opm-power). Works against a real Polatis
switch and, unchanged, against `harness emulate --protocol polatis-netconf`.
"""
import argparse
import os
import sys

import paramiko
from ncclient import manager
from ncclient.operations import RPCError

OPSW = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"


def pairs(m):
    reply = m.get_config(source="running", filter=("subtree", f'<cross-connects xmlns="{OPSW}"/>'))
    return {int(p.findtext(f"{{{OPSW}}}ingress")): int(p.findtext(f"{{{OPSW}}}egress"))
            for p in reply.data_ele.iter(f"{{{OPSW}}}pair")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("user")
    parser.add_argument("--known-hosts", help="check the switch's host key against this file")
    parser.add_argument("--connect", nargs="*", default=[], metavar="IN:OUT")
    parser.add_argument("--delete", nargs="*", default=[], type=int, metavar="IN")
    args = parser.parse_args()

    hostkey = None
    if args.known_hosts:
        keys = paramiko.HostKeys(args.known_hosts).lookup(f"[{args.host}]:{args.port}")
        hostkey = next(iter(keys.values())).get_base64() if keys else None
    with manager.connect(host=args.host, port=args.port, username=args.user,
                         password=os.environ.get("OCS_PASSWORD"), hostkey_verify=hostkey is not None,
                         hostkey_b64=hostkey, look_for_keys=False, allow_agent=False,
                         device_params={"name": "default"}, timeout=30) as m:
        print("before:", pairs(m))
        edits = [f'<pair nc:operation="delete"><ingress>{i}</ingress></pair>' for i in args.delete]
        for item in args.connect:
            ingress, egress = item.split(":")
            edits.append(f"<pair><ingress>{ingress}</ingress><egress>{egress}</egress></pair>")
        if edits:
            config = (f'<nc:config xmlns:nc="{NC}"><cross-connects xmlns="{OPSW}">'
                      + "".join(edits) + "</cross-connects></nc:config>")
            try:
                m.edit_config(target="running", config=config)
            except RPCError as err:
                print(f"refused: {err.tag} ({err.type}): {err.message}", file=sys.stderr)
                return 1
        after = pairs(m)
        print("after:", after)
        touched = sorted({int(x) for item in args.connect for x in item.split(":")})
        if touched:
            ports = "".join(f"<port><port-id>{p}</port-id><power/></port>" for p in touched)
            data = m.get(filter=("subtree", f'<opm-power xmlns="{OPSW}">{ports}</opm-power>')).data_ele
            for port in data.iter(f"{{{OPSW}}}port"):
                print(f"port {port.findtext(f'{{{OPSW}}}port-id')}: {port.findtext(f'{{{OPSW}}}power')} dBm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
