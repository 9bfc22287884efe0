"""SGLang 0.5.23 backend: server launch/attach, HTTP client, and the weight-update sequence.

Plain HTTP + torch.distributed; sglang itself is never imported (it cannot even be installed on CPU
machines; SGLang 0.5.23's server arguments). `/generate` runs on one asyncio event-loop thread over
keep-alive connections pooled per server (`AsyncHttp`), at most servers x
`SGLangEngineConfig.max_inflight_per_server` (`rollout.max_batch_size`) in flight, the rest waiting
client-side: no thread per request. The control endpoints use blocking `requests` from a small pool.

Weight update (SGLang 0.5.23's HTTP API, tests/data/sglang-0.5.23-openapi.json), for every server:
  /pause_generation {mode}      in_place (PipelineRL: keep running requests and their KV) or
                                retract / abort (PPO-off-policy)
  /begin_weight_update          0.5.23: updates outside a session fail
  /init_weights_update_group    first time only: fired to all servers without waiting, then the
                                trainer joins as rank 0, then the replies are awaited
  /update_weights_from_distributed  per bucket: HTTP first (async), then the broadcasts in
                                `names` order, then wait for both; flush_cache only when not in_place
                                (a flush is refused while requests sit in the running batch)
  /end_weight_update            always, also after a failure
  /continue_generation          after a successful update, and after a failed one (WeightSyncError):
                                the servers are never left paused.

Before any of this, the whole update is checked against the served model's parameter names and
shapes (`weight_sync.WeightManifest`, from `SGLangEngineConfig.model` or the `model_path` the
server reports when it is a local HF directory, instantiated on the meta device): an unknown name,
a wrong shape or a missing parameter raises WeightSyncError naming the tensor, and the servers are
not even paused. This matters because SGLang applies each bucket as it arrives: a tensor the server
rejected itself (no manifest available, or a dtype the server refuses) leaves the buckets before it
applied; then the engine's `version` is not advanced, generation is resumed and the error raised.

Forced interruption is done client-side in two requests: generate up to `interruption_at`
tokens; if the budget ran out, resend prompt + output + phrase for `answer_budget` more tokens.

MoE routes (rollout routing replay: the trainer re-uses the experts the engine picked): with
`SGLangEngineConfig.routes` set, requests carry
`return_routed_experts: true` (SGLang 0.5.23 `GenerateReqInput`; the server must run with
`--enable-return-routed-experts`, `SGLangServerConfig.return_routed_experts`) and the response's
`meta_info.routed_experts` is decoded: base64 of a little-endian int32 C-order array
[prompt + output tokens - 1, num_hidden_layers, top-k] of global expert ids (SGLang's
`tokenizer_manager` encodes the capturer's host buffer with `pybase64.b64encode(t.numpy().tobytes())`).
The MoE layers' columns become `Completion.routes` (expert ids only: SGLang returns no gate weights,
so `moe.routing_replay=ids_and_weights` is refused with rollout=sglang). After an interruption the
second request's routes are used only for the positions the first one did not cover (each position
keeps the route of the forward that sampled its next token, as in the local engine).

Modules: `launch.py` (server flags, launch/attach/restart/stop), `client.py` (control endpoints, errors),
`async_client.py` (the pooled /generate client), `generate.py` (request parameters, response parsing,
routes), `engine.py` (the `RolloutEngine`: dispatch, restarts, weight updates).
"""

from scalerl_mega.rollout.sglang.async_client import AsyncGenerateClient, AsyncHttp
from scalerl_mega.rollout.sglang.client import (
    PAUSE_MODES,
    BodyHook,
    SGLangClient,
    SGLangError,
    ServerDown,
    generate_body,
)
from scalerl_mega.rollout.sglang.engine import SGLangEngineConfig, SGLangRolloutEngine
from scalerl_mega.rollout.sglang.generate import (
    GenerateResult,
    RouteLayout,
    decode_routed_experts,
    parse_generate_response,
    parse_version,
    sglang_sampling_params,
    versions_per_token,
)
from scalerl_mega.rollout.sglang.launch import IN_PLACE_FLAGS, SGLangServer, SGLangServerConfig, launch_command

__all__ = [
    "IN_PLACE_FLAGS", "PAUSE_MODES", "AsyncGenerateClient", "AsyncHttp", "BodyHook", "GenerateResult", "RouteLayout",
    "SGLangClient", "SGLangEngineConfig", "SGLangError", "SGLangRolloutEngine", "SGLangServer", "SGLangServerConfig",
    "ServerDown", "decode_routed_experts", "generate_body", "launch_command", "parse_generate_response",
    "parse_version", "sglang_sampling_params", "versions_per_token",
]
