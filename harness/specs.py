"""Declared specs: inventories and step parameters as typed pydantic models.

A model says once what a file may hold — keys, types, defaults and semantic ranges (ports 1..65535,
intervals > 0, durations, timeouts and retries >= 0) — and three things follow from it: validation that
reports every problem of a file in one pass, each at its `file:line` (the YAML loader's YamlMap.where),
the defaults a step reads, and the JSON Schema shipped for editors (`harness schema`, schemas/).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping  # noqa: F401  (Literal: for step specs)

from pydantic import AfterValidator, BaseModel, Field, ValidationError, create_model, model_validator  # noqa: F401
from pydantic_core import PydanticCustomError

from devices.specs import (AtLeastOne, Count, Expect, Fraction, Interval, Name, NonNegative, Port,  # noqa: F401
                           Positive, Seconds, Spec, ranged)
from harness.errors import InputError


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list",
               dict: "a mapping", type(None): "null"}
_ERROR_WORDS = {"int": "an integer", "float": "a number", "string": "a string", "bool": "true/false",
                "list": "a list", "dict": "a mapping", "model": "a mapping", "model_attributes": "a mapping",
                "finite_number": "a finite number"}


def type_name(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:37] + '...' if len(text) > 40 else text}"


def is_instance(value: Any, types: type | tuple[type, ...]) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float) and float in types:
        return value == value and abs(value) != float("inf")  # NaN/inf are never valid settings
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


# ------------------------------------------------------------------------------------ plain unions
def union_of(types: tuple[type, ...]) -> Any:
    """A parameter of several plain types (a float takes an int; bool is never an int)."""
    def check(value):
        if not is_instance(value, types):
            raise PydanticCustomError("types", "expected {types}", {"types": type_name(types)})
        return float(value) if float in types and int not in types and type(value) is int else value

    schema = {"anyOf": [{"type": {int: "integer", float: "number", str: "string", bool: "boolean",
                                  list: "array", dict: "object", type(None): "null"}[t]} for t in types]}
    return Annotated[Any, AfterValidator(check), Field(json_schema_extra=schema)]


# ----------------------------------------------------------------------------------- error reporting
def _variants(annotation: Any) -> list[type[BaseModel]]:
    """The models of a tagged union (several models, one Literal tag field each), else []."""
    import types
    import typing

    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models if len(models) > 1 else []


def _tag(model: type[BaseModel], part: Any) -> bool:
    import typing

    return any(typing.get_origin(f.annotation) is Literal and typing.get_args(f.annotation) == (part,)
               for f in model.model_fields.values())


def _walk(model: type[BaseModel], loc: tuple) -> tuple[Any, Any, tuple, Expect | None]:
    """(FieldInfo, type, loc, Expect) that `loc` reaches in `model`, through models, dicts, lists, Annotated,
    Optional and tagged unions; the FieldInfo is the last model field passed (None when `loc` leaves the
    model); the loc comes back without the union tags pydantic inserts (`faults[0].port_flap.flaps`); the
    Expect is what the value there must be, in an error's words."""
    import types
    import typing

    current: Any = model
    info = None
    clean: list = []
    for part in (*loc, None):
        said = None
        while True:
            if typing.get_origin(current) is Annotated:
                said = said or next((m for m in current.__metadata__ if isinstance(m, Expect)), None)
                current = typing.get_args(current)[0]
            elif typing.get_origin(current) in (typing.Union, types.UnionType) and not _variants(current):
                current = [a for a in typing.get_args(current) if a is not type(None)][0]
            else:
                break
        if part is None:
            break
        variants = _variants(current)
        if variants:
            chosen = [m for m in variants if _tag(m, part)]
            if chosen:  # pydantic's tag of the variant: no key of the file
                current = chosen[0]
                continue
            current = variants[0]
        clean.append(part)
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            info = current.model_fields.get(part)
            if info is None:
                return None, None, (*clean, *loc[len(clean):]), None
            current = info.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            current = None
    return info, current, tuple(clean), said or next((m for m in (info.metadata if info else []) if isinstance(m, Expect)), None)


def _where_of(node: Any, loc: tuple, where: tuple[str, int | None]) -> tuple[tuple[str, int | None], Any, bool]:
    """Follow `loc` through the loaded YAML: (file, line) of the deepest key or item reached, the value
    there, and whether the whole path was found."""
    for part in loc:
        if isinstance(node, dict) and part in node:
            if hasattr(node, "where"):
                where = node.where(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if hasattr(node, "where"):
                where = node.where(part)
            node = node[part]
        else:
            return where, node, False
    return where, node, True


def _message(model: type[BaseModel], error: dict, value: Any) -> str:
    kind = error["type"]
    loc = error["loc"]
    if kind in ("missing", "extra_forbidden"):
        _, parent, _, _ = _walk(model, loc[:-1])
        known = ", ".join(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else ""
        if kind == "missing":
            info, _, _, _ = _walk(model, loc)
            hint = f" ({info.description})" if info is not None and info.description else ""
            return f"missing required key {loc[-1]!r}{hint}"
        return f"unknown key {loc[-1]!r} (expected one of: {known or 'none'})"
    if kind == "literal_error":
        return f"expected one of {error['ctx']['expected']}, found {describe(value)}"
    if kind == "types":
        return f"{error['msg']}, found {describe(value)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        ctx = error.get("ctx") or {}  # pydantic names the expected tags only for an invalid one
        expected = ctx.get("expected_tags")
        tags = ", ".join(repr(t) for t in expected.replace("'", "").split(", ")) if expected else ""
        one_of = f" (one of {tags})" if tags else ""
        field = str(ctx.get("discriminator", "kind")).strip("'")
        if kind == "union_tag_invalid":
            return f"{field}: expected one of {tags or 'the declared kinds'}, found {describe(ctx.get('tag'))}"
        if not isinstance(value, Mapping):
            return f"expected a mapping with key {field!r}{one_of}, found {describe(value)}"
        return f"missing required key {field!r}{one_of}"
    info, _, _, said = _walk(model, loc)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "string_pattern_mismatch",
                "too_short", "too_long"):
        expected = said or (info.description if info is not None and info.description else
                            error["msg"][0].lower() + error["msg"][1:])
        return f"expected {expected}, found {value!r}"
    for word, text in _ERROR_WORDS.items():
        if kind in (f"{word}_type", f"{word}_parsing", f"{word}_from_float"):
            return f"expected {text}, found {describe(value)}"
    if kind == "value_error" or kind.startswith("assertion"):
        return str(error.get("ctx", {}).get("error", error["msg"]))
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, found {describe(value)}"


class InputErrors(InputError):
    """Every problem of one file, each `file:line: message`, reported together."""

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.message, first.file, first.line)

    def format(self) -> str:
        return "\n".join(e.format() for e in getattr(self, "errors", [])) or super().format()


def raise_all(errors: list[InputError]) -> None:
    """Raise every problem found (none: return), in the order of the file."""
    errors = sorted(errors, key=lambda e: (e.file or "", e.line or 0))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)


def spec_errors(model: type[BaseModel], node: Any, what: str, where: tuple[str, int | None]) -> list[InputError]:
    """Every problem of `node` against `model` as InputErrors at the file:line of the key or item."""
    try:
        model.model_validate(node)
    except ValidationError as exc:
        return errors_of(exc, model, node, what, where)
    return []


def errors_of(exc: ValidationError, model, node, what: str, where) -> list[InputError]:
    out = []
    for error in exc.errors(include_url=False):
        raw = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        loc = _walk(model, raw)[2]  # the file's keys; `raw` (with union tags) still picks the right variant
        error = {**error, "loc": loc}
        at, value, _ = _where_of(node, loc, where)
        shown = loc
        if error["type"] in ("missing", "extra_forbidden"):
            shown = loc[:-1]  # the key is named in the message
            if error["type"] == "missing":
                at, _, _ = _where_of(node, shown, where)
        if error["type"] == "union_tag_invalid" and isinstance(value, dict):
            at = _where_of(node, (*loc, error["ctx"]["discriminator"].strip("'")), where)[0]
        label = (what + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in shown)).lstrip(".")
        out.append(InputError(f"{label + ': ' if label else ''}{_message(model, {**error, 'loc': raw}, value)}", *at))
    return out


def validate(model: type[BaseModel], node: Any, what: str, where: tuple[str, int | None]):
    """`model` built from `node`, or every problem raised at once (InputError / InputErrors)."""
    try:
        return model.model_validate(node)
    except ValidationError as exc:
        raise_all(errors_of(exc, model, node, what, where))


def json_schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema()
