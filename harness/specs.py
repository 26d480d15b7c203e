"""Declared specs: inventories and step parameters as typed pydantic models.

A model says once what a file may hold — keys, types, defaults and semantic ranges (ports 1..65535,
intervals > 0, durations, timeouts and retries >= 0) — and three things follow from it: validation that
reports every problem of a file in one pass, each at its `file:line` (the YAML loader's YamlMap.where),
the defaults a step reads, and the JSON Schema shipped for editors (`harness schema`, schemas/).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping  # noqa: F401  (Literal: for step specs)

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticCustomError

from harness.errors import InputError


class Spec(BaseModel):
    """Base of every declared spec: unknown keys are errors, no type is coerced (YAML `"22"` is not 22,
    `true` is not 1), NaN and infinity are never valid settings."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Expect(str):
    """What a constrained value must be, in the words an error uses (kept apart from the description,
    which a field may set for editors)."""


def _ranged(kind: type, text: str, **bounds):
    """A number with bounds that the JSON Schema shows and an error states as `text`."""
    return Annotated[kind, Field(**bounds), Expect(text)]


Port = _ranged(int, "a port number in 1..65535", ge=1, le=65535)
Interval = _ranged(int, "a positive interval", gt=0)
Seconds = _ranged(float, "a value >= 0", ge=0)
Count = _ranged(int, "a value >= 0", ge=0)
AtLeastOne = _ranged(int, "a value >= 1", ge=1)
Positive = _ranged(float, "a value > 0", gt=0)
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="letters, digits, '_', '.', '-'")]

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


# ------------------------------------------------------------------------------ tuple schemas -> models
def _range_by_name(key: str, kind: type) -> Any:
    """The semantic range a parameter of its kind meets, by its name (the playbook convention): ports,
    intervals (> 0), durations and timeouts (>= 0), retry counts (>= 0)."""
    if kind is int and (key == "port" or key.endswith("_port")):
        return Port
    if kind in (int, float) and "interval" in key:
        return _ranged(kind, "a positive interval", gt=0)
    if kind in (int, float) and (key.endswith(("_s", "_ms", "_us")) or "timeout" in key
                                 or key in ("retries", "seconds")):
        return _ranged(kind, "a value >= 0", ge=0)
    return kind


def union_of(types: tuple[type, ...]) -> Any:
    """A parameter of several plain types, checked as the tuple form always did (a float field takes an
    int; bool is never an int)."""
    def check(value):
        if not is_instance(value, types):
            raise PydanticCustomError("types", "expected {types}", {"types": type_name(types)})
        return float(value) if float in types and int not in types and type(value) is int else value

    schema = {"anyOf": [{"type": {int: "integer", float: "number", str: "string", bool: "boolean",
                                  list: "array", dict: "object", type(None): "null"}[t]} for t in types]}
    return Annotated[Any, AfterValidator(check), Field(json_schema_extra=schema)]


def model_from_schema(name: str, schema: Mapping[str, tuple], base: type[Spec] | None = None) -> type[Spec]:
    """A step model from the older `{param: (type, default | REQUIRED)}` form, with the semantic range its
    name implies (so a lab's tuple schema gets the same checks and a JSON Schema)."""
    from harness.config import REQUIRED

    fields = {}
    for key, (types, default, *_) in schema.items():
        types = types if isinstance(types, tuple) else (types,)
        nullable = type(None) in types
        plain = tuple(t for t in types if t is not type(None))
        annotation = _range_by_name(key, plain[0]) if len(plain) == 1 else union_of(plain)
        if nullable:
            annotation = annotation | None
        fields[key] = (annotation, ... if default is REQUIRED else Field(default=default, validate_default=False))
    return create_model(name, __base__=base or Spec, **fields)


# ----------------------------------------------------------------------------------- error reporting
def _walk(model: type[BaseModel], loc: tuple) -> tuple[Any, Any]:
    """(FieldInfo, type) that `loc` reaches in `model`, through models, dicts, lists, Annotated and
    Optional; the FieldInfo is the last model field passed (None when `loc` leaves the model)."""
    import types
    import typing

    current: Any = model
    info = None
    for part in (*loc, None):
        while typing.get_origin(current) in (Annotated, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(current) if a is not type(None)]
            current = args[0]
        if part is None:
            break
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            info = current.model_fields.get(part)
            if info is None:
                return None, None
            current = info.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return info, None
    return info, current


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
        _, parent = _walk(model, loc[:-1])
        known = ", ".join(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else ""
        if kind == "missing":
            info, _ = _walk(model, loc)
            hint = f" ({info.description})" if info is not None and info.description else ""
            return f"missing required key {loc[-1]!r}{hint}"
        return f"unknown key {loc[-1]!r} (expected one of: {known or 'none'})"
    if kind == "literal_error":
        return f"expected one of {error['ctx']['expected']}, found {describe(value)}"
    if kind == "types":
        return f"{error['msg']}, found {describe(value)}"
    info, _ = _walk(model, loc)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "string_pattern_mismatch",
                "too_short", "too_long"):
        said = [m for m in (info.metadata if info is not None else []) if isinstance(m, Expect)]
        expected = said[0] if said else info.description if info is not None and info.description else \
            error["msg"][0].lower() + error["msg"][1:]
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
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        error = {**error, "loc": loc}
        at, value, _ = _where_of(node, loc, where)
        shown = loc
        if error["type"] in ("missing", "extra_forbidden"):
            shown = loc[:-1]  # the key is named in the message
            if error["type"] == "missing":
                at, _, _ = _where_of(node, shown, where)
        label = (what + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in shown)).lstrip(".")
        out.append(InputError(f"{label}: {_message(model, error, value)}", *at))
    return out


def validate(model: type[BaseModel], node: Any, what: str, where: tuple[str, int | None]):
    """`model` built from `node`, or every problem raised at once (InputError / InputErrors)."""
    try:
        return model.model_validate(node)
    except ValidationError as exc:
        raise_all(errors_of(exc, model, node, what, where))


def json_schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema()
