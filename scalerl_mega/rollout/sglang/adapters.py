"""LoRA adapters on SGLang 0.5.23 servers: which version new requests run with, which versions requests still
hold, and the two ways an adapter reaches a server.

- In the request body (`/load_lora_adapter_from_tensors`, the default): one payload per TP rank, the base64
  of a plain pickle of `{name: CPU tensor}`. A plain pickle carries the bytes themselves (storages reduce to
  `torch.storage._load_from_bytes`, which SGLang's `SafeUnpickler` loads through a weights-only `torch.load`),
  not the shared-memory handles of SGLang's own `MultiprocessingSerializer`: with those the server must share
  the sender's host and sharing strategy (the fd strategy's handshake fails and the scheduler exits; the
  file_system one leaves a `torch_shm_manager` behind the sender). Adapters are megabytes, so the copy is cheap
  and any host can load it.
- From a directory (`/load_lora_adapter`, `SGLangEngineConfig.adapter_dir`): the adapter written there in PEFT
  format (`adapter_config.json`, `adapter_model.safetensors`) under its version's name, on storage every
  server reads.

`ServedAdapters` keeps the per-request binding: a sample takes the current adapter (name, version) when it
starts and holds it until it ends (both requests of an interrupted sample); a replaced version is unloaded once
its last holder ends, so SGLang never sees a request for an adapter it dropped (it would also make the unload
wait for running requests itself, `lora_registry.wait_for_unload`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.weight_sync import WeightManifest


class ServedAdapters:
    """The current adapter and the number of samples holding each version (thread-safe: samples start and end on
    the HTTP loop thread, updates come from the trainer's)."""

    def __init__(self) -> None:
        self.current: tuple[str, int] | None = None
        self._users: Counter[str] = Counter()
        self._retired: set[str] = set()
        self._lock = threading.Lock()

    def acquire(self) -> tuple[str, int] | None:
        """A sample starts: the (name, version) it runs with, None before the first adapter."""
        with self._lock:
            if self.current is not None:
                self._users[self.current[0]] += 1
            return self.current

    def release(self, name: str) -> str | None:
        """A sample holding `name` ended: `name` if it was replaced and nobody holds it any more (unload it)."""
        with self._lock:
            self._users[name] -= 1
            if self._users[name] > 0 or name not in self._retired:
                return None
            del self._users[name]
            self._retired.discard(name)
            return name

    def switch(self, name: str, version: int) -> str | None:
        """New samples run with `name` from now on: the previous adapter if nobody holds it (unload it now)."""
        with self._lock:
            prev, self.current = self.current, (name, int(version))
            if prev is None:
                return None
            if self._users[prev[0]] > 0:
                self._retired.add(prev[0])
                return None
            self._users.pop(prev[0], None)
            return prev[0]


def manifest_linears(manifest: "WeightManifest") -> dict[str, tuple[int, int]]:
    """[out, in] of every 2-D `.weight` of a served model's checkpoint manifest, by module name (the linears a
    LoRA adapter may target, `lora.check_adapter`)."""
    return {n[: -len(".weight")]: (int(s.shape[0]), int(s.shape[1])) for n, s in manifest.specs.items()
            if n.endswith(".weight") and len(s.shape) == 2}


def tensors_payload(named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> str:
    """The base64 plain pickle of `{name: contiguous CPU tensor}` that `/load_lora_adapter_from_tensors` loads
    (see module doc)."""
    import base64
    import pickle

    return base64.b64encode(pickle.dumps({n: t.detach().to("cpu").contiguous() for n, t in named_tensors})).decode()


def write_peft_dir(path: str, config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
    """`path`/adapter_config.json and adapter_model.safetensors: the adapter as PEFT 0.21 saves it."""
    import json
    import os

    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in named_tensors}, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
