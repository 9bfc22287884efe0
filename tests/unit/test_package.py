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
