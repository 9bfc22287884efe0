"""SGLang's control endpoints over blocking HTTP (`SGLangClient`), the errors every part of the SGLang
backend raises, and the /generate request body shared with the pooled client (`async_client.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scalerl_mega.interfaces import PAUSE_MODES
from scalerl_mega.jsonvalue import JSON

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.weight_sync import BucketMeta

BodyHook = Callable[[str, str, Any], None]
"""Called as hook(endpoint, "request" | "response", body) for every JSON body (tests validate)."""


class SGLangError(RuntimeError):
    """An SGLang endpoint answered with an error."""


class ServerDown(SGLangError):
    """The server did not answer (connection refused/reset, timeout)."""


def generate_body(*, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None,
                  return_routed_experts: bool, lora_path: str | None = None) -> dict[str, Any]:
    """The /generate request body (SGLang 0.5.23 `GenerateReqInput`; `lora_path`: the name of a loaded LoRA
    adapter the request runs with)."""
    body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True}
    if rid is not None:
        body["rid"] = rid
    if lora_path is not None:
        body["lora_path"] = lora_path
    if return_routed_experts:
        body["return_routed_experts"] = True
    return body


def reply_json(method: str, url: str, endpoint: str, *, status: int, content: bytes, body_hook: BodyHook | None) -> JSON:
    """An HTTP answer -> its JSON body (text if not JSON); SGLangError on a non-200 status or
    `success: false`. Shared by the blocking control client and the pooled /generate client."""
    import json

    try:
        data = json.loads(content) if content else None
    except ValueError:
        data = content.decode("utf-8", errors="replace")
    if body_hook is not None and status == 200:
        body_hook(endpoint, "response", data)
    if status != 200:
        raise SGLangError(f"{method} {url}{endpoint} -> HTTP {status}: {data}")
    if isinstance(data, dict) and data.get("success") is False:
        raise SGLangError(f"{method} {url}{endpoint} failed: {data.get('message')}")
    return data


class SGLangClient:
    """One server's HTTP endpoints. Every call has a timeout; errors raise SGLangError/ServerDown."""

    def __init__(self, url: str, *, timeout_s: float = 3600.0, body_hook: BodyHook | None = None) -> None:
        import requests

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.body_hook = body_hook
        self._session = requests.Session()

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None,
              params: dict[str, str] | None = None) -> JSON:
        import requests

        if body is not None and self.body_hook is not None:
            self.body_hook(endpoint, "request", body)
        try:
            r = self._session.request(
                method, self.url + endpoint, json=body, params=params, timeout=timeout_s or self.timeout_s
            )
        except (requests.ConnectionError, requests.Timeout) as e:
            raise ServerDown(f"{method} {self.url}{endpoint}: {e}") from e
        return reply_json(method, self.url, endpoint, status=r.status_code, content=r.content, body_hook=self.body_hook)

    def health_generate(self, *, timeout_s: float = 30.0) -> bool:
        try:
            self._call("GET", "/health_generate", timeout_s=timeout_s)
            return True
        except SGLangError:
            return False

    def model_info(self) -> dict[str, Any]:
        return self._call("GET", "/model_info")

    def server_info(self) -> dict[str, Any]:
        return self._call("GET", "/server_info")

    def generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None,
                 return_routed_experts: bool = False) -> dict:
        return self._call("POST", "/generate", generate_body(input_ids=input_ids, sampling_params=sampling_params,
                                                           rid=rid, return_routed_experts=return_routed_experts))

    def pause_generation(self, mode: str) -> JSON:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode={mode!r} must be one of {PAUSE_MODES}")
        return self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> JSON:
        return self._call("POST", "/continue_generation", {"torch_empty_cache": False})

    def abort_all(self) -> JSON:
        return self._call("POST", "/abort_request", {"abort_all": True})

    def flush_cache(self) -> JSON:
        return self._call("POST", "/flush_cache")

    def begin_weight_update(self) -> JSON:
        return self._call("POST", "/begin_weight_update", {"selector": "all"})

    def end_weight_update(self) -> JSON:
        return self._call("POST", "/end_weight_update", {})

    def init_weights_update_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> JSON:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return self._call("POST", "/init_weights_update_group", body)

    def destroy_weights_update_group(self, group_name: str) -> JSON:
        return self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, meta: BucketMeta, *, group_name: str, flush_cache: bool,
                                        set_version: bool = True) -> JSON:
        """One bucket; `set_version=False` leaves the server's weight version (a multi-sender update sets it
        once every group finished: `update_weight_version`)."""
        body = {
            "names": meta.names,
            "dtypes": meta.dtypes,
            "shapes": meta.shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": False,
            "weight_version": str(meta.version) if set_version else None,
            "load_format": meta.load_format,
        }
        return self._call("POST", "/update_weights_from_distributed", body)

    def load_lora_adapter(self, name: str, path: str) -> JSON:
        """Load the PEFT adapter directory `path` (as the server sees it) under `name`."""
        return self._call("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def load_lora_adapter_from_tensors(self, name: str, config_dict: dict[str, object], payloads: list[str]) -> JSON:
        """Load an adapter from its PEFT config and tensors: one base64 pickle of {name: tensor} per TP rank."""
        return self._call("POST", "/load_lora_adapter_from_tensors",
                          {"lora_name": name, "config_dict": config_dict, "serialized_named_tensors": payloads})

    def unload_lora_adapter(self, name: str) -> JSON:
        """Unload adapter `name` (SGLang answers once no running request uses it any more)."""
        return self._call("POST", "/unload_lora_adapter", {"lora_name": name})

    def update_weight_version(self, version: str) -> JSON:
        """Tag the tokens generated from now on with `version` (running requests are kept)."""
        return self._call("POST", "/update_weight_version", {"new_version": version, "abort_all_requests": False})
