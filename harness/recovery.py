"""Recovery after a run died without restoring its switch (SIGKILL, power loss, a failed restore).

A run on an inventory leaves a *pending restore* note next to its OCS lease (`<lock dir>/<key>.pending.json`:
run directory, run id) for as long as the switch may differ from what it found; `restore.json` in the run
directory holds what it found. A clean end (restore verified) removes the note. A later run that finds a
note of another run refuses to snapshot the switch — that would make the dead run's state "original" for
good — until `harness bench restore RUN_DIR` has put the switch back and verified it, or the lab adopts
the current state explicitly (`--adopt-current-state`, recorded in the manifest).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from devices.resources import Bench, OcsResource
from harness.errors import InputError
from harness.lock import lock_dir, ocs_lease_keys


def pending_paths(resource: OcsResource) -> list[Path]:
    """One note per lease key of the switch (its resolved endpoints): any name of it finds the note."""
    return [lock_dir() / f"{key}.pending.json" for key in ocs_lease_keys(resource)]


def _read_note(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"run_dir": "?", "run_id": "?"}  # unreadable: still a warning, never silence
    return data if isinstance(data, dict) else {"run_dir": "?", "run_id": "?"}


def read_pending(resource: OcsResource, other_than: str | None = None) -> dict | None:
    """The pending note on this switch under any of its endpoints (not run `other_than`'s), or None."""
    for path in pending_paths(resource):
        note = _read_note(path)
        if note is not None and note.get("run_dir") != other_than:
            return note
    return None


def _drop_pending(resource: OcsResource, run_dir: str | None = None) -> None:
    """Remove the switch's notes (only `run_dir`'s, or unreadable ones, when given)."""
    for path in pending_paths(resource):
        note = _read_note(path)
        if note is not None and (run_dir is None or note.get("run_dir") in (run_dir, "?")):
            path.unlink(missing_ok=True)


def mark_pending(bench: Bench, run_dir: Path, run_id: str) -> None:
    """Before anything may move: this run owns the switches' recovery until it ends cleanly."""
    for resource in bench.ocs.values():
        for path in pending_paths(resource):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"run_dir": str(Path(run_dir).resolve()), "run_id": run_id,
                                       "ocs": resource.name, "url": resource.url}) + "\n")
            os.replace(tmp, path)


def clear_pending(bench: Bench, run_dir: Path, restored: dict[str, bool] | None = None) -> None:
    """Remove this run's notes for the switches that are back as found (`restored[name]` true, or never
    snapshotted by this run)."""
    saved = _snapshots(run_dir)
    for name, resource in bench.ocs.items():
        if name not in saved or (restored or {}).get(name):
            _drop_pending(resource, str(Path(run_dir).resolve()))
            _drop_identity_notes(name, str(Path(run_dir).resolve()))


def restored_cleanly(run_dir: Path, bench: Bench, manifest: dict) -> list[str]:
    """The switches the run snapshotted, if every one of them is back as found by the record's own word
    (its teardown, or an earlier `bench restore`, verified it) and no note of this run says otherwise;
    [] when any may still differ. Restoring such a run again would roll back whatever came after it."""
    saved = [name for name in _snapshots(run_dir) if name in bench.ocs]
    extra = manifest.get("extra") or {}
    verified = {**(extra.get("restored") or {}), **(extra.get("restored_by_command") or {})}
    mine = str(Path(run_dir).resolve())
    if not saved or not all(verified.get(name) is True for name in saved):
        return []
    notes = [_read_note(path) or {} for name in saved for path in pending_paths(bench.ocs[name])]
    return [] if any(note.get("run_dir") in (mine, "?") for note in notes) else saved


def _snapshots(run_dir: Path) -> dict[str, dict[int, int]]:
    path = Path(run_dir) / "restore.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable restore.json: {exc}", str(path)) from None
    return {name: {int(i): int(e) for i, e in patches.items()} for name, patches in data.items()}


def claim_identity(key: str, name: str, run_dir: Path, run_id: str, *, adopt: bool) -> str | None:
    """Under the identity lease `key` (harness.lock.ocs_identity_key), before switch `name` is snapshotted: the
    refusal when another run's note names this very unit (reached then under another address), else this
    run's note is written and None returned."""
    path = lock_dir() / f"{key}.pending.json"
    mine = str(Path(run_dir).resolve())
    note = _read_note(path)
    if note and note.get("run_dir") != mine and not adopt:
        other = note.get("run_dir", "?")
        return (f"{name}: this switch (the same unit by its serial) was left changed by run {note.get('run_id')}; "
                f"run `harness bench restore {other}` first, or pass --adopt-current-state")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"run_dir": mine, "run_id": run_id, "ocs": name, "identity": True}) + "\n")
    os.replace(tmp, path)
    return None


def _drop_identity_notes(name: str, run_dir: str) -> None:
    for path in lock_dir().glob("ocs-id-*.pending.json"):
        note = _read_note(path) or {}
        if note.get("run_dir") == run_dir and note.get("ocs") == name:
            path.unlink(missing_ok=True)


def check_pending(bench: Bench, run_dir: Path, *, adopt: bool, warn) -> dict[str, dict]:
    """Before a run snapshots: the other runs' notes for these switches. Refuses (InputError) unless
    `adopt`; returns what was adopted (for the manifest). A note whose run never snapshotted (no
    restore.json entry) moved nothing: it is dropped with a warning."""
    adopted = {}
    mine = str(Path(run_dir).resolve())
    for name, resource in bench.ocs.items():
        note = read_pending(resource, other_than=mine)
        if not note:
            continue
        other = Path(note.get("run_dir", "?"))
        try:
            found = _snapshots(other).get(note.get("ocs", name))
        except InputError:
            found = {}
        if found is None:
            warn(f"{name}: run {note.get('run_id')} ended uncleanly but never snapshotted the switch: nothing to restore")
            _drop_pending(resource, note.get("run_dir", "?"))
            continue
        warn(f"{name}: run {note.get('run_id')} ({other}) ended without restoring the switch; what it found is "
             f"in {other / 'restore.json'}")
        if not adopt:
            raise InputError(f"{name}: will not snapshot a switch another run left changed: run "
                             f"`harness bench restore {other}` first, or pass --adopt-current-state to take the "
                             "switch as it is now as the original")
        adopted[name] = {"from_run": note.get("run_id"), "run_dir": str(other)}
    return adopted


@dataclass
class Restored:
    ocs: str
    verified: bool
    detail: str
    target: dict[int, int] = field(default_factory=dict)


def restore_switch(resource: OcsResource, found: dict[int, int], *, timeout_s: float = 15.0) -> Restored:
    """Put `found` back on the inventory's allowed ports and verify it by reading the switch back. Ports
    outside the inventory are never touched (a patch with one end outside stays as it is)."""
    from devices.errors import DeviceError
    from devices.ocs import open_switch

    allowed = resource.allowed_ports

    def mine(patches: dict[int, int]) -> dict[int, int]:
        return {i: e for i, e in patches.items() if i in allowed and e in allowed}

    target = mine(found)
    try:
        switch = open_switch(resource, timeout_s=timeout_s)
    except DeviceError as exc:
        return Restored(resource.name, False, f"cannot connect: {exc}", target)
    try:
        now = switch.patches()
        wrong = sorted(i for i, e in mine(now).items() if target.get(i) != e)  # frees their egresses too
        if wrong:
            switch.disconnect(wrong)
        missing = {i: e for i, e in target.items() if now.get(i) != e}
        if missing:
            switch.apply(missing, exclusive=False)
        after = mine(switch.patches())
        verified = after == target
        detail = (f"restored {len(missing)} and removed {len(wrong)} cross-connect(s); verified"
                  if verified else f"switch reads {after}, expected {target}")
        return Restored(resource.name, verified, detail, target)
    except (DeviceError, ValueError) as exc:
        return Restored(resource.name, False, str(exc), target)
    finally:
        switch.close()


def restore_run(run_dir: Path, bench: Bench, *, timeout_s: float = 15.0) -> list[Restored]:
    """Every switch of `bench` that the run in `run_dir` snapshotted, put back and verified; the notes of
    the verified ones are removed."""
    saved = _snapshots(run_dir)
    results = []
    for name, resource in bench.ocs.items():
        if name not in saved:
            continue
        result = restore_switch(resource, saved[name], timeout_s=timeout_s)
        results.append(result)
        if result.verified:
            _drop_pending(resource, str(Path(run_dir).resolve()))
            _drop_identity_notes(name, str(Path(run_dir).resolve()))
    return results
