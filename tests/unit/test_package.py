"""The package imports without heavy dependencies or side effects."""

import subprocess
import sys


def test_import_is_light():
    code = (
        "import sys, scalerl_mega, scalerl_mega.types, scalerl_mega.interfaces;"
        "heavy=[m for m in ('torch','megatron','transformers','sglang','triton') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_completion_mask_defaults_to_ones():
    from scalerl_mega.types import Completion, FinishReason

    c = Completion(prompt_id="p", sample_index=0, prompt_ids=[1], output_ids=[5, 6, 7],
                   gen_logprobs=[-0.1, -0.2, -0.3], weight_versions=[0, 0, 1],
                   finish_reason=FinishReason.STOP)
    assert c.mask() == [1, 1, 1]
    assert c.num_tokens == 3


def test_build_ships_every_conf_file_without_setuptools_warnings(tmp_path):
    """`make setup` was ~840 lines of setuptools "Package would be ignored" warnings: every conf/
    directory is a package in the wheel, and must be listed. Building the package lists none and ships every
    conf/**.yaml as scalerl_mega/conf/**.yaml."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "build"
    r = subprocess.run([sys.executable, "setup.py", "build_py", "-d", str(out)], cwd=repo, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    text = r.stdout + r.stderr
    assert "would be ignored" not in text and "Deprecat" not in text, text[-3000:]
    shipped = sorted(p.relative_to(out / "scalerl_mega" / "conf") for p in (out / "scalerl_mega" / "conf").rglob("*.yaml"))
    assert shipped == sorted(p.relative_to(repo / "conf") for p in (repo / "conf").rglob("*.yaml"))
    assert len(shipped) > 40
