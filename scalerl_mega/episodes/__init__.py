"""Multi-turn episodes (issue 57): an episode is one token sequence and one training sample (`types.Completion`).

    env        the environment seam (`env=custom`): reset/step in the reward workers' pool
    template   the chat template's prefix-preserving difference, checked once per tokenizer (`ChatSplicer`)
    driver     `EpisodeEngine`: episodes above any RolloutEngine, exact ids, loss mask, versions, routes
    records    metrics of a step's episodes and the `episodes.jsonl` lines
    agent      `env=agent`: the agent function in the reward pool, its endpoint calls bridged to the engines
               (the endpoint, call records and stitching: agent_server, calls, stitch, tool_calls)
    examples   environments of the demo and the docs

The package sits in the assembly layer (it runs environments in rewards/' pool over rollout/'s engines).
"""
