"""An emulation of SGLang 0.5.23's HTTP API over the project's local engine (`rollout.core.GenerationCore`):
CPU only, sglang never imported. It is not SGLang and not a test double only: it ships because the CPU
engine server (`python -m scalerl_mega.serve`, the generator step of `slurm/train_tiny.sh` and the
local-Slurm tests) serves the local engine through it, so a trainer with `rollout=sglang` drives it
exactly as it drives real SGLang servers. The tests drive the production SGLang client
(`rollout/sglang/`) against it, and `tests/sglang/` compares its answers with real SGLang's.

* `server.SGLangTestServer`: the emulation in this process (HTTP threads + one scheduler thread);
* `spawned.SpawnedTestServer`: the same in a spawned process (separate torch.distributed registry).
"""

from scalerl_mega.sglang_emulation.server import FLUSHED, RequestValidator, SGLangTestServer
from scalerl_mega.sglang_emulation.weight_updates import NO_SESSION
from scalerl_mega.sglang_emulation.spawned import SpawnedTestServer

__all__ = ["FLUSHED", "NO_SESSION", "RequestValidator", "SGLangTestServer", "SpawnedTestServer"]
