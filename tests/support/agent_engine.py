"""A tiny chat tokenizer and real local engines behind `AgentEndpoint` (tests of episodes/agent_server.py).

`chat_tokenizer()`: a byte-level BPE (vocab `VOCAB`) trained on generated text, with ChatML specials
(`<|im_start|>`, `<|im_end|>` = EOS), Hermes `<tool_call>` / `</tool_call>` and `TOOL_JSON` (one whole call as a
single added token, so that the scripted model below can emit a tool call token by token), and a Qwen-style
chat template written here (tools in the system turn, `<tool_call>` blocks on assistant turns, tool results as a
user turn in `<tool_response>`). `EngineGenerate` is the `generate` bridge onto an `InProcessRolloutEngine`;
`scripted_weights` gives a Llama whose greedy next token is a fixed function of the current token.
"""

from __future__ import annotations

import threading
from typing import Any

VOCAB = 320
TOOL_JSON = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", TOOL_JSON]
TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}"
    "{% endif %}{{ '# Tools\\n<tools>\\n' }}{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools>\\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{%- for tc in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}{{ tc.function.arguments | tojson }}"
    "{{ '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    words = ["add", "the", "numbers", "what", "is", "sum", "answer", "tool", "result", "try", "again", "user",
             "assistant", "system", "call", "function", "arguments", "name", "type", "object", "you", "are"]
    return [" ".join(rng.choices(words, k=rng.randint(3, 10))) + f' {{"a": {rng.randint(0, 99)}}} '
            f"{rng.randint(0, 999)}+{rng.randint(0, 999)}\n" for _ in range(3000)]


def chat_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False) for t in ADDED])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>")
    out.chat_template = TEMPLATE
    assert len(out) == VOCAB, len(out)
    return out


def model_config(*, hidden: int = 32) -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)


def engine(*, seed: int = 0, hidden: int = 32, max_seq_len: int = 768) -> Any:
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec

    spec = LocalModelSpec(arch="llama", config=model_config(hidden=hidden), init_seed=seed)
    return InProcessRolloutEngine(LocalEngineConfig(model=spec, core=CoreConfig(max_batch=4, max_seq_len=max_seq_len)))


def scripted_weights(chain: dict[int, int], *, hidden: int = 64, seed: int = 0, margin: float = 60.0) -> Any:
    """A Llama (config `model_config(hidden)`) whose greedy next token after token i is chain[i]: attention
    and MLP outputs are zero (o_proj, down_proj), so the final norm sees token i's embedding alone, and the
    LM head's row chain[i] is that normalised embedding scaled to a logit of `margin`."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**model_config(hidden=hidden))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        normed = emb / emb.pow(2).mean(-1, keepdim=True).add(cfg.rms_norm_eps).sqrt()
        head = model.lm_head.weight
        head.zero_()
        for src, dst in chain.items():
            head[dst] += margin * normed[src] / hidden
    return model


class EngineGenerate:
    """`generate` for `AgentEndpoint` on an `InProcessRolloutEngine`: one request at a time (a lock), polled
    until it finishes; `requests` keeps every `GenerateRequest` the engine accepted."""

    def __init__(self, eng: Any) -> None:
        self.engine = eng
        self.requests: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, req: Any) -> Any:
        from scalerl_mega.episodes.calls import GenerateResult
        from scalerl_mega.types import Prompt

        with self._lock:
            prompt = Prompt(prompt_id=f"{req.episode_id}/{len(self.requests)}", text="", task="synthetic", gold="",
                            token_ids=req.prompt_ids)
            self.engine.submit(prompt, req.sampling, n=1, version=self.engine.version)
            self.requests.append(req)
            done: list[Any] = []
            while not done:
                done = self.engine.poll(0.5)
        c = done[0]
        return GenerateResult(output_ids=c.output_ids, gen_logprobs=c.gen_logprobs, weight_versions=c.weight_versions,
                              finish_reason=c.finish_reason, routes=c.routes)
