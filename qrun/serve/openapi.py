"""GET /openapi.json (docs/serve.md §2.6): an OpenAPI 3.1 description of the server, with each
template's run request (its inputs, typed as Query.input_schema declares them) and response
(its holes' values, with a JSON Schema where the template's constraint gives one; its typed
`output` record) as a path of its own."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qrun.jsonio import FIELDS

ERROR = {"type": "object", "required": ["error", "request_id"], "properties": {
    "error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"},
        "position": {"type": "object"}}},
    "request_id": {"type": "string"}}}
ERROR_RESPONSE = {"description": "an error (docs/serve.md §4)", "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
OPTIONS = {"type": "object", "additionalProperties": False, "properties": {
    "temperature": {"type": "number", "minimum": 0}, "top_p": {"type": "number"},
    "top_k": {"type": "integer", "minimum": 0}, "min_p": {"type": "number"},
    "presence_penalty": {"type": "number"}, "frequency_penalty": {"type": "number"},
    "repetition_penalty": {"type": "number"},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number"}},
    "seed": {"type": "integer"},
    "max_tokens": {"type": "integer", "minimum": 1}, "speculate": {"type": "boolean"},
    "timeout": {"type": "number", "exclusiveMinimum": 0}}}


def openapi(descriptions: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """The document for the templates described by catalog.describe."""
    paths: dict[str, Any] = {
        "/v1/templates": {"get": {"summary": "The templates served", "responses": {
            "200": {"description": "their inputs, holes and options"}}}},
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": {"description": "Prometheus' text format"}}}},
    }
    schemas: dict[str, Any] = {"Error": ERROR, "Options": OPTIONS}
    for description in descriptions:
        name = description["name"]
        schemas[f"{name}.request"] = _request(description)
        schemas[f"{name}.response"] = _response(description)
        paths[f"/v1/templates/{name}/run"] = {"post": {
            "summary": f"Run {name}",
            "operationId": f"run_{name}",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{name}.request"}}}},
            "responses": {
                "200": {"description": "the result (or, streamed, server-sent events)",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{name}.response"}},
                            "text/event-stream": {"schema": {"type": "string"}}}},
                **{code: ERROR_RESPONSE
                   for code in ("400", "401", "404", "413", "415", "422", "429", "500",
                                "502", "503", "504")}}}}
        paths[f"/v1/templates/{name}/batch"] = {"post": {
            "summary": f"Run {name} once per JSON line",
            "operationId": f"batch_{name}",
            "requestBody": {"required": True, "content": {"application/x-ndjson": {
                "schema": {"type": "string"}}}},
            "responses": {"200": {"description": "JSON Lines, one per input line",
                                  "content": {"application/x-ndjson": {
                                      "schema": {"type": "string"}}}},
                          **{code: ERROR_RESPONSE for code in ("400", "401", "404", "413",
                                                               "415", "503")}}}}
    return {"openapi": "3.1.0", "info": {"title": "qrun serve", "version": version},
            "paths": paths, "components": {"schemas": schemas}}


def _request(description: Mapping[str, Any]) -> dict[str, Any]:
    """The run request: the template's inputs as its Query.input_schema describes them
    (typed inputs with their declared JSON Schemas), options, fields, stream."""
    inputs = dict(description["input_schema"])
    return {"type": "object", "additionalProperties": False, "properties": {
        "inputs": inputs, "options": {"$ref": "#/components/schemas/Options"},
        "fields": {"type": "array", "items": {"enum": list(FIELDS)}},
        "stream": {"type": "boolean"},
        # Known values by hole name (docs/language.md §16.1).
        "fill": {"type": "object", "propertyNames": {"enum": _fillable(description)}}}}


def _fillable(description: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(hole["name"] for hole in description["holes"]))


def _response(description: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for hole in description["holes"]:
        schema = _value_schema(hole)
        values[hole["name"]] = {"type": "array", "items": schema} if hole["in_loop"] else schema
    output = description.get("output_schema")
    return {"type": "object", "properties": {
        "text": {"type": "string"},
        "vars": {"type": "object", "properties": values},
        "stats": {"type": "object"}, "holes": {"type": "object"},
        # A typed template's result record (docs/language.md §4.2), with fields=["output"].
        "output": output if output is not None else {"type": "null"},
        # Each {% particles %} block's run (docs/language.md §23.5), as the trace has them.
        "particle_blocks": {"type": "array", "items": {"type": "object"}}}}


def _value_schema(hole: Mapping[str, Any]) -> dict[str, Any]:
    """A hole's value as JSON Schema, as far as the template says it literally."""
    if hole["kind"] == "select":
        options = hole["options"]
        return {"enum": options} if isinstance(options, list) else {"type": "string"}
    constraint = hole["constraint"]
    if constraint is None:
        return {"type": "string"}
    named = {"INT": {"type": "integer"}, "FLOAT": {"type": "number"},
             "BOOL": {"type": "boolean"}}  # typed values (docs/language.md §15.2)
    if constraint.get("named") in named:
        return named[constraint["named"]]
    if constraint["kind"] == "regex" and isinstance(constraint["pattern"], str):
        return {"type": "string", "pattern": f"^(?:{constraint['pattern']})$"}
    if constraint["kind"] == "json":
        schema = constraint["schema"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                return {}
        if isinstance(schema, bool):  # true: anything; false: nothing
            return {} if schema else {"not": {}}
        return schema if isinstance(schema, dict) else {}
    if constraint["kind"] == "tools":
        return {"type": "object", "required": ["name", "arguments"]}
    return {}
