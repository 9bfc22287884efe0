"""Multi-turn episodes: an episode is one token sequence and one training sample (`types.Completion`).

    env        the environment seam (`env=custom`): reset/step, the dataset row they receive (`task_row`)
    pool       the episodes' own threads (`env.concurrency`), apart from the reward workers
    failures   what a timed-out or raising episode becomes (`env.on_error`: dropped and counted by default)
    template   the chat template's prefix-preserving difference, checked once per tokenizer (`ChatSplicer`)
    driver     `EpisodeEngine`: episodes above any RolloutEngine, exact ids, loss mask, versions, routes
    records    metrics of a step's episodes and the `episodes.jsonl` lines
    agent      `env=agent`: the agent function on the pool, its endpoint calls bridged to the engines
               (the endpoint, call records and stitching: agent_server, calls, stitch, tool_calls)
    examples   environments of the demo and the docs
    openenv_env  an OpenEnv server's environment through `env=custom` (the optional extra `[openenv]`)

The package sits in the assembly layer (it runs environments over rollout/'s engines).
"""
