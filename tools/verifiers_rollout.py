"""One `verifiers` 0.4 episode against an OpenAI-compatible base url, run by verifiers' own interpreter.

    .venv-verifiers/bin/python tools/verifiers_rollout.py --base-url URL --taskset ID --task ROW.json \
        --out RESULT.json [--harness local|ID] [--model NAME] [--lifeline]

`make verifiers-env` builds `.venv-verifiers` (verifiers pins openai<3, the trainer's venv has openai 3).
scalerl-mega's `env=agent` calls this through `scalerl_mega.episodes.verifiers_agent` with the episode's
base url (docs/extending.md, "verifiers 0.4"); it runs on its own too, against any OpenAI-compatible server.

The episode is verifiers' own: `load_environment` builds the taskset's env (`SingleAgentEnv` for a plain
taskset), `Env.serving()` brings up its interception server, `Env.run_slot` runs the harness program, whose
model calls verifiers relays with its `EvalClient` to `--base-url`, then the taskset's `@vf.reward` functions
score the trace. The task is built from the JSON row in `--task`: the row's keys that are fields of the
taskset's `TaskData` (others are ignored). The result file gets `reward` (the trace's weighted sum),
`rewards`, `ok`, `errors`, `messages` (the final branch, wire form) and `last_reply`; the exit status is 0
when verifiers finished the episode without error, else 1. With `--lifeline` the run ends (its process group
killed: the harness program too) as soon as its stdin reaches end of file, i.e. when the process that started
it (and holds the pipe's other end) is gone, so that no episode outlives the trainer.

`--harness local` (this module's `LocalChatHarness`) runs verifiers' own chat program (the program of its
`null` harness) with this interpreter, where `null` first has `uv` resolve the program's dependencies from
the package index; the default is the taskset's own harness, run in verifiers' subprocess runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time

__all__ = ["LocalChatHarness"]

_PROGRAM = "scalerl-vf-chat.py"


def _harness_class():
    from verifiers.v1.harnesses.null import NullHarness
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    class LocalChatHarness(NullHarness):
        """verifiers' `null` chat program, run by this interpreter instead of a `uv` script environment."""

        async def setup(self, runtime) -> None:
            await runtime.write(_PROGRAM, CHAT_PROGRAM_SOURCE.encode())

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                         tool_interception_url=None):
            from verifiers.v1.dialects.chat import message_to_wire

            system_prompt, prompt = self.resolve_prompt(data)
            args = [f"--base-url={endpoint}", f"--api-key={secret}", f"--model={ctx.model}"]
            if tool_interception_url:
                args.append(f"--tool-interception-url={tool_interception_url}")
            if system_prompt:
                args.append(f"--system-prompt={system_prompt}")
            if mcp_urls:
                servers = {name: {"url": url, "timeout": self.config.tool_timeout} for name, url in mcp_urls.items()}
                args.append("--mcp-config=" + json.dumps({"mcpServers": servers}))
            if isinstance(prompt, str):
                args.append(f"--prompt={prompt}")
            elif prompt is not None:
                path = f".vf-initial-messages-{trace.id}.json"
                await runtime.write(path, json.dumps([message_to_wire(m) for m in prompt]).encode())
                args.append(f"--initial-messages-file={path}")
            return await runtime.run_program([sys.executable, _PROGRAM, *args], dict(self.config.resolved_env))

    LocalChatHarness.__module__ = __name__
    return LocalChatHarness


def __getattr__(name: str):
    """`LocalChatHarness` is built on first access, so importing this module needs no verifiers."""
    if name == "LocalChatHarness":
        cls = _harness_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _task(env, row: dict):
    task_cls = type(env.taskset).task_type()
    data_cls = task_cls.data_type()
    data = data_cls.model_validate({k: v for k, v in row.items() if k in data_cls.model_fields})
    return task_cls(data, env.taskset.config.task)


async def _episode(args: argparse.Namespace, row: dict) -> dict:
    import verifiers.v1 as vf
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.env import RunSlot

    agent: dict = {"runtime": {"type": "subprocess"}}
    if args.harness:
        agent["harness"] = {"id": "verifiers_rollout" if args.harness == "local" else args.harness}
    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": args.taskset}, "agent": agent}))
    ctx = vf.ModelContext(model=args.model, client=vf.EvalClientConfig(base_url=args.base_url,
                                                                       api_key_var="SCALERL_VERIFIERS_API_KEY"))
    async with env.serving():
        episode = await env.run_slot(RunSlot(_task(env, row)), ctx)
    trace = episode.traces[-1] if episode.traces else None
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    if trace is not None:
        errors += [f"{e.type}: {e.message}" for e in trace.errors]
    return {"ok": bool(episode.ok), "errors": errors,
            "reward": trace.reward if trace is not None else None,
            "rewards": {k: (None if r is None else r.value) for k, r in trace.rewards.items()} if trace else {},
            "messages": [message_to_wire(m) for m in trace.messages] if trace is not None else [],
            "last_reply": trace.last_reply if trace is not None else ""}


def _lifeline() -> None:
    """Blocks until stdin's end of file (the starting process closed it or is gone), then interrupts the run
    (asyncio cancels the episode: verifiers' runtime kills the harness program's process group), and kills this
    process group if it is still there 10 s later."""
    while os.read(0, 4096):  # the raw descriptor: no buffered reader's lock held at interpreter shutdown
        pass
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10.0)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the OpenAI-compatible base url (ends in /v1)")
    parser.add_argument("--taskset", required=True, help="the verifiers taskset id (an importable module)")
    parser.add_argument("--out", required=True, help="where the result JSON goes")
    parser.add_argument("--harness", default="", help="'local' (this interpreter), a harness id, or '' (the "
                                                      "taskset's own)")
    parser.add_argument("--task", required=True, help="the task row (a JSON object)")
    parser.add_argument("--model", default="scalerl-policy")
    parser.add_argument("--lifeline", action="store_true", help="end when stdin reaches end of file")
    args = parser.parse_args(argv)
    if args.lifeline:
        threading.Thread(target=_lifeline, daemon=True).start()
    with open(args.task) as f:
        row = json.load(f)
    result = asyncio.run(_episode(args, row))
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0 if result["ok"] and result["reward"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
