"""Tokenizer coverage of environment messages: the ids an environment's (or tool's) message is spliced as can hold
the tokenizer's unknown id (`<unk>`) where the text has characters the vocabulary lacks (the demo's 47-token
character tokenizer turns "no box" into `n o ␣ <unk> o <unk>`). The model then sees something else than the
message's text, which the dump's `messages` alone would hide. `UnknownIds` counts such ids per splice (the step's
`episode/unknown_ids`), warns once per run with the first example, and renders what the model saw (the decoded
ids, specials kept) for `episodes.jsonl`'s `seen`. A tokenizer without an unknown id (byte-level BPE: every text
maps) never counts one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from scalerl_mega.interfaces import Tokenizer
from scalerl_mega.jsonvalue import JSON

log = logging.getLogger(__name__)


class UnknownIds:
    """Unknown-id accounting of one run's episode driver (one instance per run: it warns once, whichever of the
    episodes' pool threads finds the first)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        unk = getattr(tokenizer, "unk_token_id", None)
        self.unk_id = None if unk is None else int(unk)
        self.warned = False
        self._lock = threading.Lock()

    def seen(self, ids: Sequence[int]) -> str:
        """The ids as the model sees them: decoded with special tokens (`<unk>` included) kept."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def count(self, ids: Sequence[int], messages: Sequence[dict[str, JSON]]) -> int:
        """Unknown ids among `ids` (the splice of `messages`); the first splice of the run holding any is logged
        as a warning naming the messages' text and what the model sees instead."""
        if self.unk_id is None:
            return 0
        n = sum(1 for i in ids if int(i) == self.unk_id)
        if not n:
            return 0
        with self._lock:
            first, self.warned = not self.warned, True
        if first:
            text = " | ".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in messages)
            log.warning("an environment message maps to %d unknown id(s) of the tokenizer (id %d, characters "
                        "outside its vocabulary): %r is seen by the model as %r; episode/unknown_ids counts them "
                        "per step, episodes.jsonl's 'seen' holds what the model saw (warned once per run)",
                        n, self.unk_id, text, self.seen(ids))
        return n
