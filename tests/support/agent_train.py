"""`python -m tests.support.agent_train RECORD_PATH OVERRIDE...`: scalerl-train's own `main` (the console
script's), with every agent episode's recorded calls (what `AgentEndpoint.close_episode` hands to the stitcher:
the exact ids sent to the engine, the ids it returned, the call's messages) appended to RECORD_PATH as one JSON
line per episode, so that a test can compare `episodes.jsonl` with what the engine returned."""

from __future__ import annotations

import json
import sys


def main() -> int | None:
    from scalerl_mega import train
    from scalerl_mega.episodes.agent_server import AgentEndpoint

    path = sys.argv.pop(1)
    close_episode = AgentEndpoint.close_episode

    def recording(self: AgentEndpoint, episode_id: str) -> list:
        calls = close_episode(self, episode_id)
        line = {"episode_id": episode_id,
                "calls": [{"prompt_ids": c.prompt_ids, "output_ids": c.output_ids, "messages": c.messages,
                           "finish_reason": c.finish_reason.value} for c in calls]}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
        return calls

    AgentEndpoint.close_episode = recording
    return train.main()


if __name__ == "__main__":
    sys.exit(main())
