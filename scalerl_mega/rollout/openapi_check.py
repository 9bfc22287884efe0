"""Validate SGLang request/response bodies against the server's OpenAPI schema (jsonschema).

Request bodies are checked against `paths[endpoint][method].requestBody` of SGLang 0.5.23's
`app.openapi()` with `$ref`s resolved from `components`, plus SGLang's stricter rule that unknown
`sampling_params` keys are rejected (the field list of `sglang/api/v1/api_types.py::SamplingParams`).

The OpenAPI response schemas are empty, and `/generate`'s says `"type": "string"` (a FastAPI
artifact; the server returns an object), so `/generate` responses are checked against the
`GenerateResponse` / `GenerateMetaInfo` / `LogprobEntry` / finish-reason contract of
`api_types.py` transcribed below, with `weight_versions` entries checked against the OpenAPI
`WeightVersionSpan` component. jsonschema (a dev dependency) is imported lazily.
"""

from __future__ import annotations

import json
from typing import Any

SAMPLING_PARAMS_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
)  # fmt: skip

_FINISH = {
    "anyOf": [
        {"type": "null"},
        {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"enum": ["stop", "length", "abort"]},
                "matched": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "array"}, {"type": "null"}]},
                "length": {"type": ["integer", "null"]},
                "message": {"type": ["string", "null"]},
                "status_code": {"type": ["integer", "null"]},
                "err_type": {"type": ["string", "null"]},
            },
        },
    ]
}
_LOGPROB_ENTRY = {
    "type": "array",
    "minItems": 2,
    "maxItems": 3,
    "prefixItems": [{"type": ["number", "null"]}, {"type": "integer"}, {"type": ["string", "null"]}],
}
GENERATE_RESPONSE_OBJECT = {
    "type": "object",
    "required": ["output_ids", "meta_info"],
    "properties": {
        "text": {"type": "string"},
        "output_ids": {"type": "array", "items": {"type": "integer"}},
        "index": {"type": ["integer", "null"]},
        "meta_info": {
            "type": "object",
            "required": ["id", "finish_reason", "prompt_tokens", "completion_tokens", "weight_version"],
            "properties": {
                "id": {"type": "string"},
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "cached_tokens": {"type": "integer"},
                "finish_reason": _FINISH,
                "output_token_logprobs": {"type": ["array", "null"], "items": _LOGPROB_ENTRY},
                "input_token_logprobs": {"type": ["array", "null"], "items": _LOGPROB_ENTRY},
                "weight_version": {"type": ["string", "null"]},
                "weight_versions": {"type": "array", "items": {"$ref": "#/components/schemas/WeightVersionSpan"}},
                "e2e_latency": {"type": ["number", "null"]},
                # base64 of little-endian int32 [tokens - 1, layers, top-k] (tokenizer_manager)
                "routed_experts": {"type": "string"},
            },
        },
    },
}


class OpenAPIValidator:
    """Checks bodies for (endpoint, method); raises jsonschema.ValidationError on violation."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self._cache: dict[str, Any] = {}

    @classmethod
    def from_file(cls, path: str) -> "OpenAPIValidator":
        with open(path) as f:
            return cls(json.load(f))

    def _validator(self, key: str, schema: dict[str, Any]):
        from jsonschema import Draft202012Validator

        if key not in self._cache:
            root = dict(schema, components=self.spec["components"])
            Draft202012Validator.check_schema(root)
            self._cache[key] = Draft202012Validator(root)
        return self._cache[key]

    def request_schema(self, endpoint: str, method: str = "post") -> dict[str, Any] | None:
        op = self.spec["paths"].get(endpoint, {}).get(method.lower())
        if op is None:
            raise ValueError(f"OpenAPI: no operation {method.upper()} {endpoint}")
        body = op.get("requestBody")
        return None if body is None else body["content"]["application/json"]["schema"]

    def validate_request(self, endpoint: str, body: object, method: str = "post") -> None:
        from jsonschema import ValidationError

        schema = self.request_schema(endpoint, method)
        if schema is None:
            if body not in (None, {}):
                raise ValidationError(f"{method.upper()} {endpoint} takes no JSON body, got {body!r}")
            return
        self._validator(f"req:{method}:{endpoint}", schema).validate(body)
        if endpoint == "/generate":
            sps = body.get("sampling_params")
            for sp in sps if isinstance(sps, list) else [sps] if sps is not None else []:
                unknown = sorted(set(sp) - set(SAMPLING_PARAMS_FIELDS))
                if unknown:
                    raise ValidationError(f"unknown field `{unknown[0]}` in sampling_params")

    def validate_response(self, endpoint: str, body: object, method: str = "post") -> None:
        op = self.spec["paths"].get(endpoint, {}).get(method.lower())
        if op is None:
            raise ValueError(f"OpenAPI: no operation {method.upper()} {endpoint}")
        if endpoint == "/generate":
            v = self._validator("resp:/generate", GENERATE_RESPONSE_OBJECT)
            for item in body if isinstance(body, list) else [body]:
                v.validate(item)
            return
        schema = op["responses"]["200"].get("content", {}).get("application/json", {}).get("schema", {})
        self._validator(f"resp:{method}:{endpoint}", schema).validate(body)
