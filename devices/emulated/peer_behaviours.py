"""Hypothesis strategies for misbehaving switch peers, and the contract every driver call must keep
against them (used by tests/test_ocs_peer_fuzz.py and benchmarks/peer_fuzz.py; needs `hypothesis`).

A behaviour is a list of pieces, rendered per command into `HostilePeer` steps: well-formed replies (with
autonomous messages spliced in at any line), replies to another ctag, garbage bytes with NULs and line
ends, a reply cut short, lines around and beyond the line limit, floods, pauses and drops.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from hypothesis import strategies as st

from devices.emulated.hostile_peer import Close, Flood, HostilePeer, Pause, Step
from devices.ocs.lines import MAX_LINE_BYTES

N = 16  # the fuzzed switch is 16x16: ingress 1..16, egress 17..32
SLACK_S = 5.0  # how late past its deadline a call may return on a loaded machine


@dataclass(frozen=True)
class Piece:
    kind: str  # reply | other_ctag | autonomous | garbage | cut | long_line | flood | pause | close
    pairs: tuple[tuple[int, int], ...] = ()
    splice: tuple[int, ...] = ()  # body line indexes before which an autonomous message is spliced
    data: bytes = b""
    seconds: float = 0.0


def _rept(atag: int, header: bool) -> list[str]:
    return (["   POLATIS 24-05-01 12:00:01"] if header else []) + [
        f"{'A ' if atag % 2 else '*C'} {atag} REPT {'EVT PATCH' if atag % 2 else 'ALM EQPT'}",
        f'   "{atag % 16 + 1}:LOS,SA"', ";"]


def tl1_reply(ctag: str, pairs, splice=(), status: str = "COMPLD") -> bytes:
    body = [f'   "{i},{e}"' for i, e in pairs]
    lines = ["", "", "   POLATIS 24-05-01 12:00:00", f"M  {ctag} {status}"]
    for index, line in enumerate(body + [";"]):
        for k, at in enumerate(splice):
            if at == index:
                lines += _rept(100 + k, header=bool(k % 2))
        lines.append(line)
    return "\r\n".join(lines).encode() + b"\r\n"


def scpi_state(pairs) -> bytes:
    return (f"(@{','.join(str(i) for i, _ in pairs)}),(@{','.join(str(e) for _, e in pairs)})\n").encode()


def render(piece: Piece, dialect: str, ctag: str) -> list[Step]:
    if piece.kind == "reply":
        return [tl1_reply(ctag, piece.pairs, piece.splice) if dialect == "tl1" else scpi_state(piece.pairs)]
    if piece.kind == "other_ctag":
        return [tl1_reply(str(int(ctag) + 7), piece.pairs) if dialect == "tl1" else b"1\n"]
    if piece.kind == "autonomous":
        return ["\r\n".join(_rept(7, header=True)).encode() + b"\r\n"] if dialect == "tl1" else [b"\n"]
    if piece.kind == "cut":
        whole = tl1_reply(ctag, piece.pairs) if dialect == "tl1" else scpi_state(piece.pairs)
        return [whole[:max(1, len(whole) * 2 // 3)]]
    if piece.kind in ("garbage", "long_line"):
        return [piece.data]
    if piece.kind == "flood":
        return [Flood(piece.data, piece.seconds)]
    if piece.kind == "pause":
        return [Pause(piece.seconds)]
    return [Close()]


valid_pairs = st.lists(st.tuples(st.integers(1, N), st.integers(N + 1, 2 * N)), max_size=8,
                       unique_by=(lambda pair: pair[0], lambda pair: pair[1])).map(tuple)  # 1:1
any_pairs = st.lists(st.tuples(st.integers(-3, 3 * N), st.integers(-3, 3 * N)), max_size=6).map(tuple)


def pieces(dialect: str, long_pauses: bool = False):
    pause = st.floats(0.0, 0.5 if long_pauses else 0.05)
    return st.one_of(
        st.builds(Piece, st.just("reply"), st.one_of(valid_pairs, any_pairs),
                  st.lists(st.integers(0, 8), max_size=3).map(tuple) if dialect == "tl1" else st.just(())),
        st.builds(Piece, st.just("other_ctag"), valid_pairs),
        st.just(Piece("autonomous")),
        st.builds(Piece, st.just("garbage"), data=st.binary(min_size=1, max_size=64)),
        st.builds(Piece, st.just("garbage"), data=st.lists(st.sampled_from(
            [b"\x00", b"\r", b"\n", b";", b'"', b"(@", b",", b":", b"M  1 COMPLD", b"9" * 40]),
            min_size=1, max_size=12).map(b"".join)),
        st.builds(Piece, st.just("cut"), valid_pairs),
        st.builds(Piece, st.just("long_line"), data=st.sampled_from(
            [MAX_LINE_BYTES - 1, MAX_LINE_BYTES, MAX_LINE_BYTES + 1, 3 * MAX_LINE_BYTES]).map(
            lambda n: b'   "' + b"1" * n + b'"\r\n')),
        st.builds(Piece, st.just("flood"), data=st.sampled_from([b"x" * 4096, b'   "1,17"\r\n' * 300]),
                  seconds=pause),
        st.builds(Piece, st.just("pause"), seconds=pause),
        st.just(Piece("close")),
    )


def behaviours(dialect: str, long_pauses: bool = False):
    return st.lists(pieces(dialect, long_pauses), min_size=1, max_size=5)


def responder(dialect: str, behaviour: list[Piece]):
    """The peer's answer to each command: SCPI's error queue and *CLS as a sane unit, then `behaviour`
    for the state query; TL1: `behaviour` for every command (with its ctag)."""
    def respond(command: str) -> list[Step]:
        if dialect == "scpi":
            upper = command.upper()
            if upper.startswith(":SYST:ERR?"):
                return [b'0,"No error"\n']
            if "STAT?" not in upper:
                return []
            ctag = "0"
        else:
            parts = command.split(":")
            ctag = parts[3].strip() if len(parts) > 3 and parts[3].strip().isdigit() else "0"
        return [step for piece in behaviour for step in render(piece, dialect, ctag)]
    return respond


def outcome_of(peer: HostilePeer, dialect: str, behaviour: list[Piece], timeout_s: float):
    """Drive one `patches()` call against `behaviour`; returns (outcome class, seconds, switch or None).
    Classes: `ok`, a DeviceError subclass name, or `CONTRACT:<what>` when the driver broke its contract
    (a bare exception, a state that cannot exist, a late return)."""
    from devices.errors import DeviceError
    from devices.ocs import open_switch
    from devices.ocs.base import ImpossibleState, check_state
    from devices.resources import OcsResource

    peer.respond = responder(dialect, behaviour)
    resource = OcsResource(name="fuzz", protocol=f"polatis-{dialect}", url=peer.url(), size=(N, N),
                           allowed_ports=frozenset(range(1, 2 * N + 1)))
    started = time.monotonic()
    switch = None
    try:
        switch = open_switch(resource, timeout_s=timeout_s)
        state = switch.last_state = switch.patches()
        try:
            check_state(state.items(), (N, N), "fuzz")
            kind = "ok"
        except ImpossibleState:
            kind = "CONTRACT:impossible state believed"
    except DeviceError as exc:
        kind = type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the contract under test: this must never happen
        kind = f"CONTRACT:{type(exc).__name__}: {exc}"[:200]
    elapsed = time.monotonic() - started
    # open_switch and patches() each have their own deadline
    if elapsed > 2 * timeout_s + SLACK_S:
        kind = f"CONTRACT:late ({elapsed:.1f} s)"
    if switch is not None:
        switch.close()
    return kind, elapsed, switch
