"""The SFT warm-start cache (engine/lora/sft.py) leaves no temp directory behind, without training a model:
``_train`` is replaced by a stand-in that writes a partial adapter and waits.

* SIGTERM in the middle of a warm start removes its temp dir and still ends the process by SIGTERM;
* an error does the same (the exception goes on);
* a temp dir left by a killed warm start (SIGKILL) is removed by the next cache lookup.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SFT = types.SimpleNamespace(enabled=True, max_steps=1, batch_size=1, lr=1e-4, max_length=64, seed=0, cache=True)
LORA = types.SimpleNamespace(rank=8, alpha=16, target_modules=["q_proj"])

CHILD = """
import sys, time, types
import engine.lora.sft as sft
from engine.tasks import Problem

def slow_train(model_path, examples, sft_cfg, lora_cfg, system_prompt, out, dtype="float32"):
    (out / "adapter_model.safetensors").write_text("half")
    print("ready", flush=True)
    time.sleep(60)

sft._train = slow_train
cfg = types.SimpleNamespace(enabled=True, max_steps=1, batch_size=1, lr=1e-4, max_length=64, seed=0, cache=True)
lora = types.SimpleNamespace(rank=8, alpha=16, target_modules=["q_proj"])
sft.warm_start("m", [Problem("p/0", "q", "1", "s")], cfg, lora, "", out_dir=sys.argv[1], dtype="float32")
print("returned", flush=True)
"""


def test_sigterm_during_warm_start_removes_the_temp_dir(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert [p.name.startswith(".") and ".tmp-" in p.name for p in tmp_path.iterdir()] == [True]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM  # still ended by the signal
    assert out.strip() == ""  # the warm start did not return
    assert list(tmp_path.iterdir()) == []


def test_error_during_warm_start_removes_the_temp_dir(tmp_path, monkeypatch):
    import engine.lora.sft as sft
    from engine.tasks import Problem

    def broken(model_path, examples, sft_cfg, lora_cfg, system_prompt, out, dtype="float32"):
        (out / "adapter_model.safetensors").write_text("half")
        raise RuntimeError("out of memory")

    monkeypatch.setattr(sft, "_train", broken)
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or a handler an earlier test left (ray.init)
    with pytest.raises(RuntimeError, match="out of memory"):
        sft.warm_start("m", [Problem("p/0", "q", "1", "s")], SFT, LORA, "", out_dir=tmp_path, dtype="float32")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before  # the warm start's handler is gone again


def test_cache_lookup_removes_a_killed_warm_starts_temp_dir(tmp_path, monkeypatch):
    import engine.lora.sft as sft
    from engine.tasks import Problem

    problems = [Problem("p/0", "q", "1", "s")]
    key = sft.sft_hash("m", problems, SFT, LORA, "", "float32")
    (tmp_path / key).mkdir()
    (tmp_path / key / "adapter_config.json").write_text("{}")  # a finished, cached warm start
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".{key}.tmp-{int(dead.stdout)}-abcd1234"  # SIGKILL in the middle of a warm start
    stale.mkdir()
    (stale / "adapter_model.safetensors").write_text("half")
    os.utime(stale, (0, 0))
    monkeypatch.setattr(sft, "_train", lambda *a, **k: pytest.fail("the cached adapter should be used"))
    assert sft.warm_start("m", problems, SFT, LORA, "", out_dir=tmp_path, dtype="float32") == tmp_path / key
    assert [p.name for p in tmp_path.iterdir()] == [key]


def test_unknown_target_module_names_the_field_and_the_models_layers():
    """lora.target_modules=[q_proj,qkv] on a model whose attention has q_proj/v_proj: one line naming the
    field and the model's linear layers (peft used to stop later with a traceback)."""
    import torch

    from engine.config import ConfigError
    from engine.lora.sft import check_target_modules

    attn = torch.nn.Module()
    attn.q_proj, attn.v_proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(attn, torch.nn.LayerNorm(4))
    check_target_modules(model, ["q_proj", "v_proj"])
    check_target_modules(model, ["0.q_proj", "1"])          # peft's rule: a full name or a dotted suffix
    with pytest.raises(ConfigError) as e:
        check_target_modules(model, ["q_proj", "qkv", "_proj"])
    msg = str(e.value)
    assert msg.startswith("lora.target_modules: ['qkv', '_proj']") and "['q_proj', 'v_proj']" in msg and "\n" not in msg


QUIET_SFT = """
import sys, types
from pathlib import Path
import engine.lora.sft as sft
from engine.model import resolve_model_path
from engine.tasks import Problem

cfg = types.SimpleNamespace(enabled=True, max_steps=2, batch_size=1, lr=1e-4, max_length=64, seed=0, cache=False)
lora = types.SimpleNamespace(rank=2, alpha=4, target_modules=["q_proj"])
problems = [Problem(f"t/{i}", f"{i} + 1?", str(i + 1), solution=f"{i} + 1 = {i + 1}") for i in range(4)]
sft._train(resolve_model_path("embedded:smollm2-135m-instruct"), problems, cfg, lora, "Answer.", Path(sys.argv[1]))
"""


@pytest.mark.integration
def test_a_redirected_warm_start_log_holds_no_progress_bars(tmp_path):
    """Issue 40: `make run > log` held TRL's SFT progress bars (tqdm's carriage-return frames) and datasets'
    tokenizing bars. With stderr not a terminal the real warm start (2 steps, the embedded model) writes none."""
    log_path = tmp_path / "stderr.log"
    with open(log_path, "w") as err:
        proc = subprocess.run([sys.executable, "-c", QUIET_SFT, str(tmp_path / "adapter")], cwd=REPO, stderr=err,
                              stdout=subprocess.DEVNULL, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    text = log_path.read_text()
    assert proc.returncode == 0, text[-2000:]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert "it/s]" not in text and "s/it]" not in text and "%|" not in text, text[-2000:]
