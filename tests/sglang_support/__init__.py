"""Tooling for the `sglang`-marked tests (`make test-sglang`): a real SGLang 0.5.23 server on CPU.

* `tiny_model`: the tiny FP32 Llama (and MoE) checkpoints + byte-level BPE tokenizer, generated here;
* `server_path/sgl_kernel`: a pure-torch stand-in for the one CPU kernel SGLang does not ship for CPUs
  (on the server's PYTHONPATH only);
* `real_server`: launch through the project's own `SGLangServer` with the CPU flags, and teardown.
"""
