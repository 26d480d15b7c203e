"""The import rules of ARCHITECTURE.md, checked on the source: a layer that reaches up fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in sorted(_imports(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(ROOT)} imports {module}")
    return out


@pytest.mark.parametrize("package, forbidden", [
    ("devices", ("harness",)),
    ("analysis", ("harness", "devices", "traces")),
    ("traces", ("harness",)),
])
def test_no_layer_imports_upwards(package, forbidden):
    assert _violations(package, forbidden) == []


def test_the_checker_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from harness.runner import run\n    import devices.emulated.bench\n")
    assert {"harness.runner", "devices.emulated.bench"} <= _imports(probe)


HEAVY = {"numpy", "pandas", "pyarrow", "scipy", "matplotlib", "dask", "pydantic", "yaml", "paramiko", "rich"}


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_cli_start_up_leaves_the_heavy_libraries_to_the_commands_that_use_them(argv):
    """`harness --version` and `harness --help` (and every CLI process: it builds the parser of every
    sub-command) import none of the heavy libraries: numpy alone is ~0.1 s, pandas, pyarrow and scipy ~1.5 s of
    CPU per process. They belong inside the commands that use them (benchmarks/bench_cli_startup.py times it)."""
    import subprocess
    import sys

    code = ("import sys\nfrom harness.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    loaded = set(out.rpartition("MODULES ")[2].split())
    assert "harness.commands.profile" in loaded and "harness.commands.traces" in loaded  # the check is live
    assert "ocs-hil" in out or "usage: harness" in out                                  # and so is the command
    assert {m.split(".")[0] for m in loaded} & HEAVY == set()


# What a step may not reach for, rule by rule (issue #33): the bench runtime (harness.bench, handed to a step as
# `ctx.bench`) gives a step what it needs, so the safety rules (lease, restore) and the emulator's glue live once.
STEP_RULES = {
    "no step imports another step (shared pieces live in harness.bench or harness.outcome)": ("harness.steps",),
    "no step imports the emulator's glue (ctx.bench.truth, ctx.bench.faults)": ("harness.bench.emulated",
                                                                              "devices.emulated"),
    "no step parses a device's output (ctx.bench.traffic)": ("devices.parsers",),
    "no step drives the host agent (ctx.bench.hosts, harness.bench.hosts)": ("devices.hostagent",),
}


def _step_violations(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((root / "harness" / "steps").glob("*.py")):
        if path.name == "__init__.py":  # the package re-exports harness.outcome for labs' step modules
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        modules = _imports(path) | {f"harness.steps.{node.module}" for node in ast.walk(tree)
                                    if isinstance(node, ast.ImportFrom) and node.level and node.module}
        reads = any(isinstance(node, ast.Attribute) and node.attr == "emulated" and isinstance(node.value, ast.Name)
                    and node.value.id == "ctx" for node in ast.walk(tree))
        for rule, prefixes in STEP_RULES.items():
            for module in sorted(modules):
                if any(module == p or module.startswith(p + ".") for p in prefixes):
                    found.setdefault(rule, []).append(f"{path.relative_to(root)} imports {module}")
        if reads:
            found.setdefault("no step reads ctx.emulated (ctx.bench.truth: None on a real bench)", []).append(
                f"{path.relative_to(root)} reads ctx.emulated")
    return found


def test_a_step_reaches_only_the_bench_runtime():
    assert _step_violations(ROOT) == {}


def test_the_step_rules_catch_each_way_around_the_runtime(tmp_path):
    steps = tmp_path / "harness" / "steps"
    steps.mkdir(parents=True)
    (steps / "a.py").write_text("from harness.steps.b import x\nfrom .c import y\n")
    (steps / "d.py").write_text("def f(ctx):\n    from devices.parsers.bench_tools import p\n    return ctx.emulated\n")
    (steps / "e.py").write_text("import devices.hostagent\nfrom harness.bench.emulated import Faults\n")
    (steps / "ok.py").write_text("from harness.outcome import StepOutcome\ndef f(ctx):\n    return ctx.bench.truth\n")
    found = _step_violations(tmp_path)
    assert sorted(found) == sorted([*STEP_RULES, "no step reads ctx.emulated (ctx.bench.truth: None on a real bench)"])
    assert found[next(iter(STEP_RULES))] == ["harness/steps/a.py imports harness.steps.b",
                                               "harness/steps/a.py imports harness.steps.c"]
    assert not any("ok.py" in site for sites in found.values() for site in sites)


# No import circle among the project's modules, function-local imports included: a circle held together by
# imports inside functions (to dodge the ImportError a top-level one would meet) hides which module is the
# lower layer, and every new module on it needs one more such import (issue #33 opened the last one: runner,
# resume, config, specs, sweep, finish and harness.bench.emulated). Imports under `if TYPE_CHECKING:` never run.
PACKAGES = ("harness", "devices", "analysis", "traces")


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the first-party modules it imports, at any depth (a name imported from a package counts as its
    submodule when there is one)."""
    modules = _modules(root)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: set[str] = set()
        stack = [ast.parse(path.read_text(), filename=str(path))]
        while stack:
            for node in ast.iter_child_nodes(stack.pop()):
                if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                    stack.extend(node.orelse)
                    continue
                stack.append(node)
                if isinstance(node, ast.Import):
                    edges |= {known(alias.name) for alias in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        up = package.split(".")[:len(package.split(".")) - node.level + 1]
                        base = ".".join(up + ([base] if base else []))
                    edges |= {known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules else known(base)
                              for alias in node.names}
        graph[module] = edges - {None, module}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    import graphlib

    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_no_import_circle():
    circle = _circle(_import_graph(ROOT))
    assert circle is None, ("rule: no import circle among harness/devices/analysis/traces modules, not even "
                            "through imports inside functions; move what both sides need into the lower "
                            "module: " + " -> ".join(reversed(circle)))


def test_the_circle_check_sees_a_circle_through_a_function_local_import(tmp_path):
    (tmp_path / "harness" / "sub").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "sub" / "__init__.py").write_text("")
    (tmp_path / "harness" / "a.py").write_text("from harness.sub import b\n")
    (tmp_path / "harness" / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    (tmp_path / "harness" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    import harness.a\n")
    (tmp_path / "harness" / "d.py").write_text("import harness.c\n")
    graph = _import_graph(tmp_path)
    assert graph["harness.c"] == set() and graph["harness.d"] == {"harness.c"}
    assert sorted(_circle(graph)[1:]) == ["harness.a", "harness.sub.b"]
