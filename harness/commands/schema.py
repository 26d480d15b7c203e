"""`harness schema inventory|playbook|profile`: print the JSON Schema of a file kind, generated from its declared
spec (harness/specs.py) — the same models that validate the files. Editors read the copies in schemas/."""
from __future__ import annotations

import argparse
import json


def inventory_schema() -> dict:
    from harness.config import InventorySpec

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **InventorySpec.model_json_schema()}


def playbook_schema() -> dict:
    """The playbook's top-level keys, and each step as one of the registered step types' parameters."""
    from harness.config import discover_steps, playbook_model

    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **playbook_model().model_json_schema()}
    defs = schema.setdefault("$defs", {})
    choices = []
    for name, step in sorted(discover_steps().items()):
        params = step.model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(params.pop("$defs", {}))
        params["properties"] = {"type": {"const": name}, "name": {"type": "string", "minLength": 1},
                                **params.get("properties", {})}
        params["required"] = ["type", *params.get("required", [])]
        defs[params.get("title", name)] = params
        choices.append({"$ref": f"#/$defs/{params.get('title', name)}"})
    schema["properties"]["steps"] = {"type": "array", "minItems": 1, "items": {"oneOf": choices},
                                     "title": "Steps"}
    return schema


def profile_schema() -> dict:
    from devices.emulated.profile import ProfileSpec

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **ProfileSpec.model_json_schema()}


SCHEMAS = {"inventory": inventory_schema, "playbook": playbook_schema, "profile": profile_schema}


def render(kind: str) -> str:
    return json.dumps(SCHEMAS[kind](), indent=2, sort_keys=True) + "\n"


def run(args: argparse.Namespace) -> int:
    print(render(args.kind), end="")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("schema", help="print the JSON Schema of inventories, playbooks or timing profiles",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(SCHEMAS), help="which file kind")
    parser.set_defaults(func=run)
