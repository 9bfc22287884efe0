"""One scripted HTTP exchange (SGLang 0.5.23's API, the part the project's client uses) and a field-by-field
comparison of two servers' answers: the real server and the emulation (`scalerl_mega/sglang_emulation/`)."""

from __future__ import annotations

import threading
from typing import Any

import requests

VOLATILE = {"id", "message", "error", "detail", "e2e_latency", "response_sent_to_client_ts"}
"""Keys whose values differ between any two runs (ids, timings, wording): compared by type only."""
REAL_ONLY_META = {"cached_tokens_details", "dp_rank", "e2e_latency", "response_sent_to_client_ts"}
"""`/generate` meta_info keys the real server adds and the emulation leaves out (timings, DP rank)."""


def _post(url: str, path: str, body: Any) -> tuple[int, Any]:
    r = requests.post(url + path, json=body, timeout=120)
    try:
        return r.status_code, r.json() if r.content else None
    except ValueError:
        return r.status_code, r.text


def _get(url: str, path: str) -> tuple[int, Any]:
    r = requests.get(url + path, timeout=120)
    try:
        return r.status_code, r.json() if r.content else None
    except ValueError:
        return r.status_code, r.text


def _push(url: str, model: Any, *, version: str, group: Any, group_name: str, steps: list) -> None:
    """pause(retract) -> begin -> one bucket of every tensor -> end -> continue, recording each answer."""
    import torch.distributed as dist

    from scalerl_mega.weight_sync import dtype_name

    named = list(model.state_dict().items())
    steps.append(("pause", *_post(url, "/pause_generation", {"mode": "retract"})))
    steps.append(("begin", *_post(url, "/begin_weight_update", {"selector": "all"})))
    body = {"names": [n for n, _ in named], "dtypes": [dtype_name(t.dtype) for _, t in named],
            "shapes": [list(t.shape) for _, t in named], "group_name": group_name, "flush_cache": True,
            "abort_all_requests": False, "weight_version": version, "load_format": None}
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _post(url, "/update_weights_from_distributed", body)))
    t.start()
    for _, tensor in named:
        dist.broadcast(tensor.contiguous(), src=0, group=group)
    t.join(120)
    steps.append(("update_weights_from_distributed", *box["r"]))
    steps.append(("end", *_post(url, "/end_weight_update", {})))
    steps.append(("continue", *_post(url, "/continue_generation", {"torch_empty_cache": False})))


def scripted_exchange(url: str, *, old: Any, new: Any, group_name: str) -> list[tuple[str, int, Any]]:
    """The script, as (step, HTTP status, JSON body). The server serves `old`; the script pushes `new`
    (version "1"), generates, pushes `old` back (version "0") and leaves the group."""
    from scalerl_mega.weight_sync import destroy_group, free_port, init_custom_process_group

    greedy = {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "stop_token_ids": [], "no_stop_trim": True}
    prompt = [1, 11, 12, 13, 14]
    steps: list[tuple[str, int, Any]] = [("health", *_get(url, "/health")), ("model_info", *_get(url, "/model_info"))]
    gen = {"input_ids": prompt, "sampling_params": greedy, "return_logprob": True, "rid": "script-1"}
    steps.append(("generate", *_post(url, "/generate", gen)))
    steps.append(("generate_batch", *_post(url, "/generate", {
        "input_ids": [prompt, prompt[:3]], "sampling_params": greedy, "return_logprob": True})))
    steps.append(("generate_unknown_param", *_post(url, "/generate", {
        "input_ids": prompt, "sampling_params": {"max_tokens": 3}})))
    steps.append(("update_outside_session", *_post(url, "/update_weights_from_distributed", {
        "names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]], "group_name": group_name})))
    steps.append(("flush_cache_idle", *_post(url, "/flush_cache", None)))
    steps.append(("abort_all_idle", *_post(url, "/abort_request", {"abort_all": True})))
    port = free_port()
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _post(url, "/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
        "group_name": group_name, "backend": "gloo"})))
    t.start()
    group = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0,
                                      group_name=group_name, timeout_s=60.0)
    t.join(120)
    steps.append(("init_weights_update_group", *box["r"]))
    try:
        _push(url, new, version="1", group=group, group_name=group_name, steps=steps)
        steps.append(("generate_after_update", *_post(url, "/generate", {**gen, "rid": "script-2"})))
        steps.append(("model_info_after_update", *_get(url, "/model_info")))
        _push(url, old, version="0", group=group, group_name=group_name, steps=steps)
        steps.append(("destroy_group", *_post(url, "/destroy_weights_update_group", {"group_name": group_name})))
    finally:
        destroy_group(group)
    return steps


def compare(real: Any, emu: Any, *, path: str = "", tol: float = 1e-4) -> list[str]:
    """Differences, field by field, of the emulation's answer from the real one's: every key the emulation
    sends must be in the real answer with the same type and value (floats within `tol`; `VOLATILE` keys by
    type only); the real `/generate` meta_info may add only `REAL_ONLY_META`."""
    out: list[str] = []
    if isinstance(real, dict) and isinstance(emu, dict):
        for k in emu:
            if k not in real:
                out.append(f"{path}.{k}: sent by the emulation only")
            elif k in VOLATILE:
                if type(real[k]) is not type(emu[k]) and real[k] is not None and emu[k] is not None:
                    out.append(f"{path}.{k}: type {type(real[k]).__name__} != {type(emu[k]).__name__}")
            else:
                out += compare(real[k], emu[k], path=f"{path}.{k}", tol=tol)
        if path.endswith("meta_info"):
            extra = set(real) - set(emu) - REAL_ONLY_META
            out += [f"{path}.{k}: sent by the real server only" for k in sorted(extra)]
        return out
    if isinstance(real, list) and isinstance(emu, list):
        if len(real) != len(emu):
            return [f"{path}: {len(real)} items != {len(emu)}"]
        for i, (a, b) in enumerate(zip(real, emu)):
            out += compare(a, b, path=f"{path}[{i}]", tol=tol)
        return out
    if isinstance(real, float) or isinstance(emu, float):
        if not (isinstance(real, (int, float)) and isinstance(emu, (int, float)) and abs(real - emu) <= tol):
            out.append(f"{path}: {real!r} != {emu!r}")
        return out
    if real != emu or type(real) is not type(emu):
        out.append(f"{path}: {real!r} != {emu!r}")
    return out
