"""Recording the MoE routes of the engine's own forwards (`GenerationCore`, mixed in): a forward hook on every HF MoE
router collects the top-k expert ids and gate weights of each token, a forward's routes are cut into its rows, and a
finished row's routes become a `types.Routes` (routing replay sends them to the trainer, so that trainer and generator
route each token alike: docs/running_scalerl.md, MoE rollout routing replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalerl_mega.types import Routes, route_id_dtype

if TYPE_CHECKING:  # pragma: no cover
    import torch


class RouteRecorder:
    """Mixed into `core.GenerationCore`, which provides `_torch`, `_routers` (the HF MoE routers in layer order),
    `_route_buf` (None: not recording) and `version`; rows carry `routes` and `routes_n`."""

    def _route_hook(self, module: "torch.nn.Module", args: tuple["torch.Tensor", ...],
                    output: tuple["torch.Tensor", "torch.Tensor"]) -> None:
        """Forward hook on each HF MoE router: (expert ids, gate weights) of the top-k experts of every
        token of this forward. HF Llama-4 returns (`router_scores` [N, E] = sigmoid of the top-k logits, 0
        elsewhere, `router_logits` [N, E]); the ids are the top-k of the logits, as in the router. HF
        Qwen3-MoE returns (`router_logits` [N, E], the top-k weights [N, K] (softmax over all experts,
        renormalised over the top-k when `norm_topk_prob`), their expert ids [N, K])."""
        if self._route_buf is None:
            return
        if len(output) == 3:
            _, weights, ids = output
            self._route_buf.append((ids, weights.float()))
            return
        scores, logits = output
        ids = self._torch.topk(logits, module.top_k, dim=1).indices
        self._route_buf.append((ids, scores.gather(1, ids).float()))

    def _take_routes(self, rows: int, cols: int):
        """The routes of the forward that just ran, ([rows, cols, L, K] ids, weights), or None."""
        buf, self._route_buf = self._route_buf, None
        if not buf:
            return None
        torch = self._torch
        ids = torch.stack([b[0] for b in buf], dim=1)
        w = torch.stack([b[1] for b in buf], dim=1)
        return ids.view(rows, cols, *ids.shape[1:]), w.view(rows, cols, *w.shape[1:])

    def _add_routes(self, r, routes, row: int, col0: int) -> None:
        ids, w = routes[0][row, col0:], routes[1][row, col0:]
        if ids.shape[0]:
            r.routes.append((ids, w, self.version))
            r.routes_n += ids.shape[0]

    def _routes(self, r) -> "Routes | None":
        """The row's recorded routes as a `Routes` (positions 0..routes_n-1), or None."""
        if not self._routers:
            return None
        torch = self._torch
        L, K = len(self._routers), self._routers[0].top_k
        id_dtype = getattr(torch, route_id_dtype(int(self._routers[0].weight.shape[0])))  # [E, hidden]
        if not r.routes:
            return Routes(num_layers=L, topk=K, expert_ids=torch.zeros(0, dtype=id_dtype).numpy(),
                          weights=torch.zeros(0).numpy(), versions=[])
        ids = torch.cat([c[0] for c in r.routes]).to(id_dtype)
        w = torch.cat([c[1] for c in r.routes]).float()
        versions = [v for c in r.routes for v in [c[2]] * c[0].shape[0]]
        return Routes(num_layers=L, topk=K, expert_ids=ids.flatten().cpu().numpy(),
                      weights=w.flatten().cpu().numpy(), versions=versions)
