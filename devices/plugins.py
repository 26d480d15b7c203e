"""Extension without forking: a lab's own step types, switch protocols and tool parsers, from its own package.

Two ways in, both ending in the plugin module registering itself with the project's registries
(`harness.config.register_step`, `devices.ocs.registry.register_protocol`, `devices.parsers.registry`):
- an installed distribution's entry points, one group per kind (`GROUPS`), each entry naming a module
  (`my_lab.steps = "my_lab.steps"` under `[project.entry-points."ocs_hil.steps"]`), loaded the first time the
  project looks that kind up;
- an `imports:` list in an inventory or playbook (module names, or `.py` files relative to that file), as
  labgrid's environment `imports`.
A module is imported once, however many times it is named. A plugin that fails to import, or registers a name
that is taken, is a `PluginError` naming the plugin, never a traceback.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from importlib import metadata
from pathlib import Path

GROUPS = {"steps": "ocs_hil.steps", "ocs": "ocs_hil.ocs", "parsers": "ocs_hil.parsers"}


class PluginError(ValueError):
    """A plugin that cannot be loaded; the message names it and says why, in one line."""


_loaded_groups: set[str] = set()
_lock = threading.RLock()


def load_group(group: str) -> list[str]:
    """Import every module the installed distributions name under entry-point `group` (once per process);
    returns their names. Raises PluginError naming every one that failed (the others are loaded)."""
    with _lock:
        if group in _loaded_groups:
            return []
        _loaded_groups.add(group)  # a failing plugin is reported once, not again at every lookup
        names, failed = [], []
        for entry in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = getattr(entry.dist, "name", None) or "unknown distribution"
            try:
                entry.load()
            except Exception as exc:  # the others still load; every failure is named
                failed.append(f"plugin {entry.name!r} ({entry.value}, from {dist}, entry point group {group}): "
                              f"{type(exc).__name__}: {exc}")
                continue
            names.append(entry.name)
        if failed:
            raise PluginError("; ".join(failed))
        return names


def import_module(name: str, base: Path | None = None) -> object:
    """A plugin named in an `imports:` list: a module name (`my_lab.ocs`) or a `.py` file (relative to `base`,
    the folder of the file that names it). Imported once per process."""
    with _lock:
        if not name.endswith(".py"):
            try:
                return importlib.import_module(name)
            except Exception as exc:
                raise PluginError(f"plugin {name!r}: {type(exc).__name__}: {exc}") from exc
        path = Path(name).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        path = path.resolve()
        if not path.is_file():
            raise PluginError(f"plugin {name!r}: no such file {path}")
        # one module per file, named from its path: named twice (inventory and playbook), imported once
        module_name = f"ocs_hil_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise PluginError(f"plugin {name!r} ({path}): {type(exc).__name__}: {exc}") from exc
        return module
