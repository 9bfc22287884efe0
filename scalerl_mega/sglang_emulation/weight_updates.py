"""The weight-update endpoints of the SGLang emulation (`server.SGLangTestServer`), with SGLang 0.5.23's rules:
`/update_weights_from_distributed` only inside a `/begin_weight_update` .. `/end_weight_update` session; names,
dtypes and shapes of equal lengths, known names, the model's shapes and dtypes, received in `names` order before
they are checked (as SGLang does); `/init_weights_update_group` blocks until the trainer joins (with a deadline)."""

from __future__ import annotations

from scalerl_mega.jsonvalue import JSON

JSONBody = JSON
"""A request or response body as JSON decodes it."""

NO_SESSION = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"


class HTTPError(Exception):
    """An endpoint's refusal: the HTTP status and the JSON body the server answers with."""

    def __init__(self, status: int, body: JSONBody) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body


class WeightUpdateEndpoints:
    """Mixed into `SGLangTestServer`, which provides `_cv` (its lock), `core` (the engine), `session_open`,
    `group`, `group_name`, `receiver`, `version_names`, `sync_timeout_s` and `_flush_refused`."""

    def _begin(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            if self.session_open:
                raise HTTPError(400, {"success": False, "message": "a weight update session is already open"})
            self.session_open = True
        return 200, {"success": True, "message": "weight update session opened"}

    def _end(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            if not self.session_open:
                raise HTTPError(400, {"success": False, "message": "no weight update session is open"})
            self.session_open = False
        return 200, {"success": True, "message": "weight update session closed"}

    def _init_group(self, body: dict) -> tuple[int, JSONBody]:
        from scalerl_mega.weight_sync import DistWeightReceiver, WeightSyncError, init_custom_process_group

        if self.group is not None:
            raise HTTPError(400, {"success": False, "message": "weight update group already initialized"})
        try:
            group = init_custom_process_group(
                backend=body.get("backend", "nccl"),
                init_method=f"tcp://{body['master_address']}:{body['master_port']}",
                world_size=int(body["world_size"]),
                rank=int(body["rank_offset"]),  # + tp_rank (the test server is TP 1)
                group_name=body.get("group_name", "weight_update_group"),
                timeout_s=self.sync_timeout_s,
            )
        except WeightSyncError as e:
            raise HTTPError(400, {"success": False, "message": str(e)}) from None
        self.group = group
        self.group_name = body.get("group_name", "weight_update_group")
        self.receiver = DistWeightReceiver(group, timeout_s=self.sync_timeout_s)
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def _destroy_group(self, body: dict) -> tuple[int, JSONBody]:
        from scalerl_mega.weight_sync import destroy_group

        if self.group is not None and body.get("group_name", "weight_update_group") == self.group_name:
            destroy_group(self.group)
            self.group = self.receiver = None
        return 200, {"success": True, "message": "destroyed"}

    def _update_weights(self, body: dict) -> tuple[int, JSONBody]:
        from scalerl_mega.weight_sync import BucketMeta, WeightSyncError, dtype_from_name, dtype_name

        def fail(msg: str):
            return HTTPError(400, {"success": False, "message": msg})

        if not self.session_open:
            raise fail(NO_SESSION)
        if self.receiver is None or body.get("group_name", "weight_update_group") != self.group_name:
            raise fail(f"no weight update group named {body.get('group_name')!r}")
        names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
        if not (len(names) == len(dtypes) == len(shapes)):
            raise fail(f"names/dtypes/shapes lengths differ: {len(names)}/{len(dtypes)}/{len(shapes)}")
        try:
            for d in dtypes:
                dtype_from_name(d)
        except ValueError as e:
            raise fail(str(e)) from None
        version = body.get("weight_version")
        meta = BucketMeta(names=names, dtypes=dtypes, shapes=shapes, version=-1, load_format=body.get("load_format"))
        try:
            tensors = self.receiver.receive_bucket(meta)
        except WeightSyncError as e:
            raise fail(f"broadcast failed: {e}") from None
        params = dict(self.core.model.named_parameters())
        if "lm_head.weight" not in params:
            params["lm_head.weight"] = self.core.model.get_output_embeddings().weight
        for i, (n, t) in enumerate(tensors):
            p = params.get(n)
            if p is None:
                raise fail(f"names[{i}]={n!r} is not a parameter of the model")
            if list(p.shape) != list(t.shape) or dtype_name(p.dtype) != dtypes[i]:
                raise fail(
                    f"names[{i}]={n!r}: got {dtypes[i]}{list(t.shape)}, model has {dtype_name(p.dtype)}{list(p.shape)}"
                )
        with self._cv:
            self.core.load_weights(tensors)
            if version is not None:
                if version not in self.version_names:
                    self.version_names.append(version)
                self.core.set_version(self.version_names.index(version))
            if body.get("flush_cache", True) and self._flush_refused():
                raise fail("weights loaded but flush_cache was refused: requests are running")
        return 200, {"success": True, "message": "Succeeded to update parameter online."}
