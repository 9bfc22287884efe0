"""Every tolerance the README and docs/ state as a guarantee is asserted by a test that `.ci/run` runs.

FIGURES holds {doc, the figure's text, the test that asserts it, the assertion's text}: the figure must still be
in the doc (whitespace-insensitive), the test function must exist, the assertion's text must be in the test
file (or in the helper module named), and the test must be in a suite `.ci/run` runs: `make test` (no slow, gpu,
network, sglang, slurm or compat mark), `make test-compat` (compat-marked, in the Makefile's COMPAT_TESTS),
`make test-sglang` (sglang-marked, under tests/sglang/) or `make test-slurm` (slurm-marked). Figures stated as ranges over repeated
runs are checked against their committed records (tests/unit/test_demo_runs_doc.py and the predictability test
below); one-off measurements are labelled in the docs as measured, beside the tested bound.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXCLUDED_FROM_CI = {"slow", "gpu", "network"}


@dataclass(frozen=True)
class Figure:
    doc: str
    text: str  # the figure as the doc states it (whitespace-insensitive)
    test: str  # "path::function"
    asserts: str | tuple[str, ...]  # the bound as the test (or `helper`) writes it (each of them)
    helper: str = ""  # a module holding the bound, when the test imports it


FIGURES = [
    Figure("docs/sglang.md", "`/generate` log-probs == transformers within 1e-5 (measured 6.5e-7 to 2.4e-6",
           "tests/sglang/test_real_qwen3.py::test_logprobs_match_transformers", ("TOL = 1e-5", "max(diffs) < TOL")),
    Figure("docs/sglang.md", "log-probs of the server's samples equal the server's within 1e-5",
           "tests/sglang/test_real_qwen3.py::test_trainer_logprobs_equal_the_servers_after_its_pushes",
           "TOL = 1e-5"),
    Figure("docs/sglang.md", "(log_softmax in float64) within 1e-4 (measured 4.8e-7)",
           "tests/sglang/test_real_in_place.py::test_generation_and_logprobs_match_the_trainer", "TOL = 1e-4"),
    Figure("docs/sglang.md", "every field the emulation sends equal to the real one (greedy tokens identical, "
           "log-probs within 1e-4)",
           "tests/sglang/test_real_in_place.py::test_emulation_answers_the_scripted_exchange_like_the_real_server",
           "tol: float = 1e-4", helper="tests/sglang_support/exchange.py"),
    Figure("docs/sglang.md", "the in_place update's log-probs match the old-KV/new-weights reference within 1e-5 too",
           "tests/sglang/test_real_qwen3.py::"
           "test_in_flight_update_under_checkpoint_names_lands_at_the_token_boundary",
           ("TOL = 1e-5", "c.output_ids, b)) < TOL")),
    Figure("docs/sglang.md", "whose log-probs equal a full transformers forward within 1e-5",
           "tests/unit/test_engine_gdn.py::test_engine_logprobs_equal_a_full_forward_and_batching_changes_no_token",
           ("TOL = 1e-5", "zip(ref, c.gen_logprobs)) < TOL")),
    Figure("docs/sglang.md", "naming the step and URL within the 60 s sync deadline + 10 s (measured ~1 s)",
           "tests/sglang/test_real_in_place.py::test_server_death_mid_update_raises_a_named_error_in_bounded_time",
           "assert took < 60.0 + 10.0"),
    Figure("docs/running_scalerl.md", "loss and grad norm agree within 1e-3 relative",
           "tests/integration/test_multirank_dense.py::test_two_ranks_match_one", "REL_TOL = 1e-3",
           helper="tests/integration/multirank_util.py"),
    Figure("docs/running_scalerl.md", "Qwen3-MoE at EP2 with `ids` replay matches the 1-rank run to REL_TOL (1e-3 relative",
           "tests/integration/test_multirank_qwen3.py::test_qwen3_moe_layouts_and_routing_replay_match_one_rank",
           "REL_TOL = 1e-3", helper="tests/integration/multirank_util.py"),
    Figure("docs/running_scalerl.md", "log-probs of packed rows == unpacked rows (max abs diff < 1e-5",
           "tests/integration/test_microbatch_packing.py::test_packed_logprobs_equal_unpacked", "TOL = 1e-5"),
    Figure("docs/cluster_and_gpu.md", "all match the single-process losses and grad norms to 1e-5 over 3 steps",
           "tests/integration/test_megatron_parallel.py::test_layout_matches_single_process", "REL = 1e-5"),
    Figure("docs/cluster_and_gpu.md", "a TP2 checkpoint loads at TP1 with logits within 1e-6",
           "tests/integration/test_megatron_parallel.py::test_checkpoint_tp2_loads_at_tp1_with_same_logits",
           '["logits_max_abs_diff"] < 1e-6'),
    Figure("docs/cluster_and_gpu.md", "Megatron logits equal `transformers` within 1e-5 at TP1, TP2 with sequence "
           "parallelism, EP2 and PP2",
           "tests/integration/test_convert_megatron.py::test_llama4_logits_and_export_tp1_tp2_ep2_pp2",
           "max(diffs) <= 1e-5"),
    Figure("docs/cluster_and_gpu.md", "For EP2 training checkpoints (TP2 and PP2 in the slow suite) the HF model's "
           "logits match the trainer's within 1e-5",
           "tests/integration/test_convert_distckpt.py::test_hf_logits_equal_trainer_logits",
           '(hf_logp - lp["logp"].double()).abs().max().item() <= 1e-5'),
    Figure("docs/running_scalerl.md", "against float64 under `TRITON_INTERPRET=1` to 2e-5 nats",
           "tests/unit/test_objective_triton.py::test_triton_kernel_under_interpreter_matches_torch",
           "assert r[k] < 2e-5"),
    Figure("docs/running_scalerl.md", "`ids_and_weights` within 1e-5",
           "tests/integration/test_routing_replay.py::"
           "test_replay_makes_routes_agree_and_does_not_increase_log_ratio", 'assert both["max"] < 1e-5'),
    Figure("docs/scaling_science.md", "(A within 0.02, B and C_mid within 10%) at noise 0.005",
           "tests/unit/test_scaling_fit.py::test_fast_recovers_paper_runs", "assert abs(f.A - A) <= 0.02 "
           "assert abs(f.B - B) <= 0.10 * B assert abs(f.C_mid - cm) <= 0.10 * cm"),
    Figure("docs/extending.md", "its log-probs agree with a float64 transformers forward over the whole sample "
           "(< 1e-4)", "tests/integration/test_agent_endpoint.py::test_a_multi_call_agent_is_one_sample_of_exact_ids",
           "for j in gen_pos) < 1e-4"),
    Figure("docs/failure_behaviour.md", "resource tracker gone within 5 s",
           "tests/faults/test_sigterm.py::"
           "test_group_sigterm_checkpoints_exits_zero_resumes_and_kill_9_leaves_no_process", "killed + 5.0"),
    Figure("docs/running_scalerl.md", "(it checks its parent every second; tested within 5 s)",
           "tests/unit/test_preemption_children.py::"
           "test_kill_9_of_the_parent_takes_spawned_and_forked_children_within_5_s",
           "assert not _wait_gone(kids, within_s=5.0)"),
    Figure("docs/failure_behaviour.md", "raise within the 15 s deadline + 10 s in the test",
           "tests/integration/test_rollout_local_engine.py::"
           "test_receiver_dying_mid_sync_fails_the_sender_within_timeout",
           "assert elapsed < timeout + 10"),
    Figure("docs/failure_behaviour.md", "ends the torchrun job non-zero naming the rank (`exitcode : -9`)",
           "tests/integration/test_multirank_moe.py::test_kill_nine_follower_exits_and_rerun_resumes",
           ("assert rc != 0", '"rank : 1 (local_rank: 1)" in text and "exitcode : -9" in text')),
    Figure("docs/cluster_and_gpu.md", "checks `tools/plan.py`'s byte counts against the dry run (within 5%",
           "tests/integration/test_dry_run.py::test_planner_matches_the_dry_run_within_5_percent",
           "pytest.approx(planned[theirs], rel=0.05)"),
    Figure("docs/cluster_and_gpu.md", "Peaks: 8B dp16 131.8 GiB (GB200 only)",
           "tests/unit/test_docs_plan_tables.py::"
           "test_a_layout_that_does_not_fit_exits_2_in_the_planner_and_the_launch_check",
           'round(out["trainer"]["total_bytes"] / P.GiB, 1) == 131.8'),
    Figure("docs/cluster_and_gpu.md", "Scout tp4 ep16 dp4 169.5 GiB (none)",
           "tests/unit/test_slurm_scripts.py::test_dry_run_checks_memory_without_nvml_against_the_gpu_type",
           '"plans 169.5 GiB per GPU, more than 164.6 GiB" in r.stderr'),
    Figure("docs/cluster_and_gpu.md", "a TP2 checkpoint resumes at TP1 within 2e-3 (bf16)",
           "tests/integration/test_megatron_precision.py::test_checkpoint_reshards_tp2_to_tp1_and_training_continues",
           'pytest.approx(after["loss"], rel=2e-3)'),
    Figure("docs/cluster_and_gpu.md", "keeps tree + wheels under 60 MiB",
           "tests/unit/test_device_tree_size.py::test_tracked_tree_plus_gpu_wheels_fit_the_device",
           "LIMIT_MIB = 60.0"),
    Figure("docs/sglang.md", "with the fix < 1e-4, and a boundary one token off either way is rejected by > 1e-2",
           "tests/sglang/test_real_in_place.py::test_in_place_update_with_a_request_in_flight_tags_the_exact_boundary",
           "b + 1)) > 1e-2"),
    Figure("docs/sglang.md", "on-policy engine-vs-trainer log-prob max below 1e-3",
           "tests/sglang/test_real_rl_demo.py::test_demo_recipe_on_real_sglang", "max(mismatch) < 1e-3"),
    Figure("docs/extending.md", "so the best blind answer passes with probability 1/30",
           "tests/unit/test_lookup_episodes.py::test_a_blind_answer_passes_only_for_the_hidden_number_it_guesses",
           "assert best == Fraction(1, 30)"),
    Figure("docs/running_scalerl.md", "a blind answer passes with probability at most 1/30",
           "tests/unit/test_lookup_episodes.py::test_a_blind_answer_passes_only_for_the_hidden_number_it_guesses",
           "assert best == Fraction(1, 30)"),
]


# The GPU suite's bounds (`make test-gpu`, tests/gpu): no GPU in `.ci/run`, so these are the bounds of the dated
# H200 session in docs/cluster_and_gpu.md; the doc and the suite must state the same bound.
GPU_BOUNDS = [
    Figure("docs/cluster_and_gpu.md", "CISPO loss relative error ≤ 1e-4; logp absolute error ≤ 1e-4",
           "tests/gpu/test_fused_logprob_gpu.py::test_fused_kernel_matches_float64", "TOL_LOGP = TOL_LOSS = 1e-4"),
    Figure("docs/cluster_and_gpu.md", "gradients ‖Δ‖/‖ref‖ ≤ 2e-5 for FP32 and ≤ 8e-3 for bf16",
           "tests/gpu/test_fused_logprob_gpu.py::test_fused_kernel_matches_float64",
           'TOL_GRAD = {"float32": 2e-5, "bfloat16": 8e-3}'),
    Figure("docs/cluster_and_gpu.md", "the resumed losses equal the uninterrupted run's within 2e-6 relative",
           "tests/gpu/test_megatron_gpu.py::test_save_load_then_the_next_steps_match_the_uninterrupted_run",
           "RESUME_REL_TOL = 2e-6"),
    Figure("docs/sglang.md", "SGLang's log-probs within a mean |dlogp| < 0.05 of the FP32 trainer forward",
           "tests/gpu/test_gdn_sglang_gpu.py::test_sglang_serves_a_pushed_qwen3_5_like_the_trainer",
           "MEAN_TOL = 0.05"),
]

def _norm(text: str) -> str:
    return " ".join(text.split())


def _marks(node: ast.AST) -> set[str]:
    """pytest mark names under `node` (a decorator or a `pytestmark` value), leaving out the marks of single
    `pytest.param` cases (one slow case does not take the test's other cases out of CI) and `parametrize`."""
    skip = {id(s) for sub in ast.walk(node) if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "param" for s in ast.walk(sub)}
    return {sub.attr for sub in ast.walk(node) if id(sub) not in skip and isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"} - {"parametrize"}


def test_marks(source: str, function: str) -> set[str] | None:
    """The marks on `function` in `source` (module `pytestmark` included), or None when it is not defined."""
    tree = ast.parse(source)
    module = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
            module |= _marks(stmt.value)
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == function:
            return module | set().union(*(_marks(d) for d in stmt.decorator_list))
    return None


test_marks.__test__ = False  # a helper, not a test


def ci_suite(path: str, marks: set[str]) -> str | None:
    """The `.ci/run` suite that runs a test with these marks in this file, or None."""
    if "sglang" in marks:
        return "test-sglang" if path.startswith("tests/sglang/") and not marks & EXCLUDED_FROM_CI else None
    if "slurm" in marks:
        return "test-slurm" if "slow" not in marks else None
    if marks & EXCLUDED_FROM_CI:
        return None
    if "compat" in marks:  # left out of `make test`; `make test-compat` runs it when its file is on the list
        return "test-compat" if path in compat_files() else None
    return "test"  # `make test` runs every file of tests/ (test-compat repeats some under Python 3.12)


def compat_files() -> set[str]:
    """The Makefile's COMPAT_TESTS (the test files `make test-compat` runs)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^COMPAT_TESTS\s*:=\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def test_ci_suite_by_hand():
    assert ci_suite("tests/unit/a.py", set()) == "test"
    assert ci_suite("tests/unit/a.py", {"timeout", "usefixtures"}) == "test"
    assert ci_suite("tests/unit/a.py", {"slow"}) is None
    assert ci_suite("tests/sglang/a.py", {"sglang"}) == "test-sglang"
    assert ci_suite("tests/integration/a.py", {"sglang"}) is None
    assert ci_suite("tests/sglang/a.py", {"sglang", "slow"}) is None
    assert ci_suite("tests/slurm/a.py", {"slurm"}) == "test-slurm"
    assert ci_suite("tests/gpu/a.py", {"gpu"}) is None
    assert ci_suite("tests/integration/test_multirank_moe.py", {"compat"}) == "test-compat"
    assert ci_suite("tests/unit/a.py", {"compat"}) is None  # not on the Makefile's COMPAT_TESTS list


def test_marks_by_hand():
    src = ("import pytest\npytestmark = [pytest.mark.sglang, pytest.mark.usefixtures('x')]\n"
           "@pytest.mark.slow\ndef test_a():\n    pass\n"
           "@pytest.mark.parametrize('p', [pytest.param(1, marks=pytest.mark.slow), 2])\ndef test_b(p):\n    pass\n"
           "def test_c():\n    pass\n")
    assert test_marks(src, "test_a") == {"sglang", "usefixtures", "slow"}
    assert test_marks(src, "test_b") == {"sglang", "usefixtures"}  # one case slow, the other in CI
    assert test_marks(src, "test_c") == {"sglang", "usefixtures"}
    assert test_marks(src, "test_d") is None


NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)(%?)")


def values(text: str) -> set[float]:
    """The numbers written in `text` (`5%` is 0.05), as floats: a figure and its test's bound compare by value."""
    return {float(m.group(1)) / (100 if m.group(2) else 1) for m in NUMBER.finditer(text)}


def function_source(source: str, function: str) -> str | None:
    """The source text of the top-level function `function` in `source`, or None."""
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == function:
            return ast.get_source_segment(source, stmt)
    return None


def asserted_in(asserts: str, *, body: str, module: str) -> bool:
    """The assertion is the test's: its text is in the test function's body or in a function of the module the
    body calls, or it is a constant's definition (`NAME = value`, `name: type = value`) in the module whose NAME
    the body uses."""
    called = [ast.get_source_segment(module, f) for f in ast.parse(module).body
              if isinstance(f, ast.FunctionDef) and re.search(rf"\b{f.name}\(", body)]
    if any(_norm(asserts) in _norm(text) for text in [body, *called]):
        return True
    m = re.match(r"^\s*(\w+)\s*(?::[^=]*)?=", asserts)
    return bool(m) and _norm(asserts) in _norm(module) and re.search(rf"\b{m.group(1)}\b", body) is not None


def _check_stated_and_asserted(fig: Figure) -> tuple[str, set[str]]:
    """The figure is in its doc, its test exists, each assertion text is that test's (in its body, or a constant
    it uses; with `helper`, in the helper module the test calls) and the assertions hold a value the figure
    states; returns the test's path and marks."""
    stated = _norm(fig.text) in _norm((ROOT / fig.doc).read_text())
    assert stated, f"{fig.doc} no longer states: {fig.text}"
    path, function = fig.test.split("::")
    source = (ROOT / path).read_text()
    marks = test_marks(source, function)
    assert marks is not None, f"{path} has no test {function}"
    body = function_source(source, function)
    all_asserts = (fig.asserts,) if isinstance(fig.asserts, str) else fig.asserts
    for asserts in all_asserts:
        if fig.helper:
            helper = (ROOT / fig.helper).read_text()
            names = {n.name for n in ast.parse(helper).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert _norm(asserts) in _norm(helper), f"{fig.helper} does not assert {asserts}"
            assert any(re.search(rf"\b{n}\b", body) for n in names), f"{fig.test} calls nothing of {fig.helper}"
        else:
            assert asserted_in(asserts, body=body, module=source), f"{fig.test} does not assert {asserts}"
    shared = values(fig.text) & values(" ".join(all_asserts))
    assert shared, f"{fig.test}: no value of '{fig.text}' is in its assertions {all_asserts}"
    return path, marks


def test_figures_link_by_value_by_hand():
    assert values("within 5% and 1e-5 (measured 6.5e-7), 60 MiB") == {0.05, 1e-5, 6.5e-7, 60.0}
    src = "TOL = 1e-5\nOTHER = 2\ndef test_a():\n    assert x < TOL\ndef test_b():\n    assert y < 1e-3\n"
    assert asserted_in("TOL = 1e-5", body=function_source(src, "test_a"), module=src)
    assert not asserted_in("TOL = 1e-5", body=function_source(src, "test_b"), module=src)  # another test's bound
    assert not asserted_in("OTHER = 2", body=function_source(src, "test_a"), module=src)
    assert asserted_in("y < 1e-3", body=function_source(src, "test_b"), module=src)
    assert not asserted_in("y < 1e-3", body=function_source(src, "test_a"), module=src)  # text elsewhere in the file
    src += "def _check(y):\n    assert y <= 2e-5\ndef test_c():\n    _check(3)\n"
    assert asserted_in("y <= 2e-5", body=function_source(src, "test_c"), module=src)  # in a function it calls
    assert not values("within 1e-5") & values("y < 1e-3")  # a figure whose test asserts another value


def test_the_docs_count_of_linked_figures_is_right():
    """docs/architecture.md states how many of the docs' tolerances are linked to tests here."""
    n = len(FIGURES) + len(GPU_BOUNDS)
    text = _norm((ROOT / "docs" / "architecture.md").read_text())
    assert f"{n} stated tolerances are each linked to the test asserting them" in text, n


@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f"{f.doc}:{f.text[:40]}")
def test_figure_is_in_its_doc_and_asserted_in_ci(fig):
    path, marks = _check_stated_and_asserted(fig)
    assert ci_suite(path, marks), f"{fig.test} (marks {sorted(marks)}) is in no suite .ci/run runs"


def test_readme_predictability_figures_are_the_committed_results():
    """README: 'for 2 of 3 seeds ..., the fit registered at half-way held over the second half within 1.0x and
    1.4x the noise floor' is reproduction/predictability/results.json, rounded as printed."""
    runs = json.loads((ROOT / "reproduction" / "predictability" / "results.json").read_text())["runs"]
    held = [r["second_half"]["ratio"] for r in runs.values() if r["second_half"]["forecast"]]
    text = _norm((ROOT / "README.md").read_text())
    line = (f"for {len(held)} of {len(runs)} seeds of 6,400 steps, the fit registered at half-way held over the "
            f"second half within {min(held):.1f}x and {max(held):.1f}x the noise floor")
    assert line in text, line


def test_running_doc_demo_phases_and_gain_are_the_committed_runs():
    """docs/running_scalerl.md's 'SFT a-b s, RL c-d s' and '0.53 -> lo-hi' are ranges over docs/demo_runs.json."""
    from tests.unit.test_demo_runs_doc import value_range

    runs = json.loads((ROOT / "docs" / "demo_runs.json").read_text())["runs"]
    text = _norm((ROOT / "docs" / "running_scalerl.md").read_text())
    phases = (f"SFT {value_range([r['sft_s'] for r in runs], '{:.0f}')} s, "
              f"RL {value_range([r['rl_s'] for r in runs], '{:.0f}')} s")
    gain = f"{value_range([r['first'] for r in runs])} -> {value_range([r['last'] for r in runs])}"
    assert phases in text and gain in text, (phases, gain)


SGLANG_RL = {  # docs/sglang.md's account of `make sglang-rl-compare` -> the cell of its committed record
    "on-policy log-probs within 1.9e-5 of the trainer's on SGLang": "| 1.9e-05 / 3.3e-07 (12) |",
    "reward +0.23 (SGLang) and +0.20 (local)": "(+0.231) | -0.338 -> -0.138 (+0.200) |",
    "validation +0.09 and +0.11": "(+0.094; steps 0-40) | 0.305 -> 0.414 (+0.109; steps 0-40) |",
    "at 6.1 s per RL step on SGLang's CPU decode against 1.2 s": "| 6.1 s (972 s) | 1.2 s (55 s) |",
}


@pytest.mark.parametrize("doc_text", sorted(SGLANG_RL))
def test_sglang_rl_compare_figures_are_its_committed_record(doc_text):
    assert _norm(doc_text) in _norm((ROOT / "docs" / "sglang.md").read_text()), doc_text
    assert SGLANG_RL[doc_text] in (ROOT / "reproduction" / "sglang_rl" / "sglang_rl.md").read_text()


@pytest.mark.parametrize("fig", GPU_BOUNDS, ids=lambda f: f"{f.doc}:{f.text[:40]}")
def test_gpu_bound_in_the_doc_is_the_gpu_suites(fig):
    _, marks = _check_stated_and_asserted(fig)
    assert "gpu" in marks, f"{fig.test}: not a gpu-marked test"
