"""A failing property test of a kernel with a display name prints a replay command that works verbatim."""

from __future__ import annotations

import subprocess

from ._repo import TINY_PRESET, clean_env, run_pytest

KERNELS = '''
import flashcheck, torch

@flashcheck.kernel(name="mylib:decode", dtypes=("fp32",), head_dims=(16,))
def decode(q, k, v, *, scale, causal, attn_mask=None):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    out = torch.softmax(s, -1) @ v.double()
    out[..., 3:, :] *= 1.01  # rows past 3 are 1% off
    return out.to(q.dtype)
'''
TESTS = '''
import flashcheck
from mylib_kernels import decode

test_decode = flashcheck.property_test(decode, preset="tiny.toml", max_examples=20, seed=1)
'''


def test_the_printed_replay_command_of_a_display_named_kernel_works_verbatim(tmp_path):
    (tmp_path / "mylib_kernels.py").write_text(KERNELS)
    (tmp_path / "test_decode.py").write_text(TESTS)
    (tmp_path / "tiny.toml").write_text(TINY_PRESET)
    result = run_pytest(tmp_path, "--flashcheck-device", "cpu", PYTHONPATH=str(tmp_path))
    assert result.ret == 1, "\n".join(result.outlines[-30:])
    replay = next(line.split("replay: ", 1)[1] for line in result.outlines if line.lstrip().startswith("replay: "))
    assert "--kernel" not in replay, "the case records its kernel's import path itself"
    done = subprocess.run(replay, shell=True, cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and done.stdout.startswith("BUG: mylib:decode on fp32"), done.stdout + done.stderr
