"""model.dtype=auto: the compute dtype chosen from faked processor descriptions (engine/hardware.py)."""
from __future__ import annotations

import logging

import pytest

from engine.hardware import (CPUInfo, DeviceInfo, GPUInfo, amx_switched_off, cap_flags, canonical_dtype, dtype_record, read_cpu_info,
                             resolve_dtype)

BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma f16c"
AVX2 = f"{BASE} avx2"
AVX512 = f"{AVX2} avx512f avx512dq avx512bw avx512vl avx512_vnni"
AVX512_BF16 = f"{AVX512} avx512_bf16"
AMX = f"{AVX512_BF16} amx_tile amx_bf16 amx_int8"


def cpu(flags: str, model: str = "Fake CPU", cores: int = 2) -> DeviceInfo:
    return DeviceInfo(cpu=CPUInfo(model=model, flags=frozenset(flags.split()), cores=cores))


def gpu(bf16: bool) -> DeviceInfo:
    return DeviceInfo(cpu=cpu(AVX2).cpu, gpu=GPUInfo(name="Fake GPU", bf16=bf16))


@pytest.mark.parametrize("device, purpose, dtype, reason_has", [
    (cpu(AVX2), "inference", "float32", "CPU: AVX2, no native bf16"),            # desktop/laptop, older servers
    (cpu(AVX512), "inference", "float32", "CPU: AVX-512, no native bf16"),       # Skylake/Cascade Lake-style
    (cpu(AVX512_BF16), "inference", "bfloat16", "CPU: AVX512-BF16, native bf16"),  # Cooper Lake, Zen 4
    (cpu(AMX), "inference", "bfloat16", "CPU: AMX, native bf16"),                # Sapphire Rapids and later
    (cpu(BASE), "inference", "float32", "CPU: pre-AVX2, no native bf16"),
    (cpu(AMX), "training", "float32", "training on CPU keeps float32"),          # SFT / GRPO on a CPU
    (cpu(AVX2), "training", "float32", "no native bf16"),
    (gpu(True), "inference", "bfloat16", "GPU: Fake GPU, bf16 supported"),       # Ampere and later
    (gpu(False), "inference", "float16", "bf16 not supported"),                  # Volta/Turing
    (gpu(True), "training", "bfloat16", "GPU"),
])
def test_auto_follows_the_processor(device, purpose, dtype, reason_has):
    got, reason = resolve_dtype("auto", device, purpose=purpose)
    assert got == dtype
    assert reason_has in reason


@pytest.mark.parametrize("requested, device, dtype", [
    ("bfloat16", cpu(AVX2), "bfloat16"),   # explicit wins, even where it is slow (with a warning)
    ("float32", cpu(AMX), "float32"),
    ("float16", gpu(True), "float16"),
    ("bf16", cpu(AMX), "bfloat16"),        # aliases
    ("fp32", gpu(True), "float32"),
])
def test_explicit_dtype_wins(requested, device, dtype):
    got, reason = resolve_dtype(requested, device)
    assert got == dtype
    assert reason.startswith(f"explicit model.dtype={dtype}")


def test_explicit_bf16_warns_only_without_native_bf16(caplog):
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("bfloat16", cpu(AVX2))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "float32" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("bfloat16", cpu(AMX))
        resolve_dtype("bfloat16", gpu(False))  # GPUs emulate nothing: no CPU warning
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_auto_logs_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("auto", cpu(AVX2))
    assert [r.getMessage() for r in caplog.records] == ["dtype auto -> float32 (CPU: AVX2, no native bf16)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("auto", cpu(AVX2), log_choice=False)
    assert not caplog.records


@pytest.mark.parametrize("bad", ["bfloat", "int8", "", "float64"])
def test_unknown_dtype_is_one_line_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"^model\.dtype=.*: use auto") as e:
        canonical_dtype(bad)
    assert "\n" not in str(e.value)


def test_read_cpu_info_parses_proc_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                 f"flags\t\t: {AVX2} sha_ni\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: {AMX}\n")
    info = read_cpu_info(f, environ={})
    assert info.model == "AMD EPYC 7B13"           # the first processor block
    assert info.flags == frozenset(f"{AVX2} sha_ni".split())
    assert info.isa == "AVX2" and not info.native_bf16 and info.capped_by is None
    assert info.cores >= 1


def test_missing_cpuinfo_means_no_flags(tmp_path):
    info = read_cpu_info(tmp_path / "absent", environ={})
    assert info.flags == frozenset() and info.model
    assert resolve_dtype("auto", DeviceInfo(cpu=info))[0] == "float32"


@pytest.mark.parametrize("environ, isa, native", [
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "AVX2", False),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AMX", True),   # ATen's element-wise kernels only: bf16 GEMMs stay native
    ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "AVX2", False),  # the AVX2 emulation
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX-512", False),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, "AVX512-BF16", True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "AMX", True),   # not a cap below what the CPU has
    ({"ATEN_CPU_CAPABILITY": "avx512"}, "AMX", True),
    ({}, "AMX", True),
])
def test_environment_caps_the_flags(tmp_path, environ, isa, native):
    f = tmp_path / "cpuinfo"
    f.write_text(f"model name\t: Fake Xeon\nflags\t\t: {AMX}\n")
    info = read_cpu_info(f, environ=environ)
    assert info.isa == isa and info.native_bf16 == native
    assert (info.capped_by is not None) == (isa != "AMX")
    if info.capped_by:
        assert info.capped_by.split("=")[0] in environ
        assert info.capped_by in resolve_dtype("auto", DeviceInfo(cpu=info))[1]


@pytest.mark.parametrize("flags, environ, expect", [
    ("AMX", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"),  # the no-AMX emulation
    ("AMX", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
    ("AMX", {"ONEDNN_MAX_CPU_ISA": "AVX10_1_512"}, "ONEDNN_MAX_CPU_ISA=AVX10_1_512"),  # oneDNN's name for FP16's level
    ("AMX", {"DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "DNNL_MAX_CPU_ISA=AVX512_CORE_BF16"),  # the older variable
    ("AMX", {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None),  # the newer one wins
    ("AMX", {"ONEDNN_MAX_CPU_ISA": " AVX512_CORE_BF16 "}, None),  # oneDNN ignores a value with spaces
    ("AMX", {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, "ONEDNN_MAX_CPU_ISA=avx512_core_bf16"),
    ("AMX", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None),   # AMX kept
    ("AMX", {"ATEN_CPU_CAPABILITY": "avx2"}, None),             # not oneDNN's cap
    ("AMX", {}, None),
    ("AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, None),             # no AMX to switch off
])
def test_amx_switched_off_only_where_a_cap_removes_amx_the_cpu_has(tmp_path, flags, environ, expect):
    f = tmp_path / "cpuinfo"
    f.write_text(f"model name\t: Fake\nflags\t\t: {AMX if flags == 'AMX' else AVX2}\n")
    assert amx_switched_off(environ, cpuinfo=f) == expect


def test_the_vllm_plugin_tells_torch_there_is_no_amx_only_under_such_a_cap(monkeypatch):
    """vLLM's CPU attention picks AMX from torch.cpu._is_amx_tile_supported(); under an AMX-removing oneDNN
    cap the kernel never granted AMX to the process, and that kernel died with SIGILL."""
    import torch

    from engine.backends.fast_lora import plugin

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr("engine.hardware.amx_switched_off", lambda: None)
    assert plugin.follow_amx_cap() is None and torch.cpu._is_amx_tile_supported() is True
    monkeypatch.setattr("engine.hardware.amx_switched_off", lambda: "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16")
    assert plugin.follow_amx_cap() == "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"
    assert torch.cpu._is_amx_tile_supported() is False


def test_cap_flags_keeps_unrelated_flags():
    flags, by = cap_flags(frozenset(AMX.split()), {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert flags == frozenset(AVX2.split()) and by == "ONEDNN_MAX_CPU_ISA=AVX2"


def test_dtype_record_names_the_processor():
    rec = dtype_record("auto", "float32", "CPU: AVX2, no native bf16", cpu(AVX2, model="AMD EPYC"))
    assert rec["requested"] == "auto" and rec["dtype"] == "float32"
    assert rec["device"]["cpu"]["model"] == "AMD EPYC" and rec["device"]["gpu"] is None
    assert rec["device"]["cpu"]["flags"] == {"avx2": True, "avx512f": False, "avx512_bf16": False,
                                             "amx_bf16": False, "amx_tile": False}


def test_this_machine_resolves():
    dtype, reason = resolve_dtype("auto")
    assert dtype in ("bfloat16", "float16", "float32") and reason


def test_sft_cache_key_follows_the_training_dtype():
    from engine.config import LoRAConfig, SFTConfig
    from engine.lora.sft import sft_hash
    from engine.tasks import Problem

    rows = [Problem("p1", "1 + 1?", "2", "1 + 1 = 2. The final answer is \\boxed{2}.")]
    args = ("model-dir", rows, SFTConfig(), LoRAConfig(), "system")
    legacy = sft_hash(*args)                      # keys made before the dtype was hashed
    assert sft_hash(*args, "float32") == legacy   # float32 (CPU) keeps them valid
    assert sft_hash(*args, "bfloat16") != legacy != sft_hash(*args, "float16")
    off = SFTConfig(enabled=False)                # peft's init does not depend on the dtype
    assert sft_hash("m", rows, off, LoRAConfig(), "s", "bfloat16") == sft_hash("m", rows, off, LoRAConfig(), "s")
    with pytest.raises(ValueError, match="resolve model.dtype first"):
        sft_hash(*args, "auto")


def test_bench_records_and_prints_flags_and_dtype():
    from engine.commands.bench import format_table, machine_info

    dev = cpu(AVX2, model="AMD EPYC 7B13", cores=2)
    machine = machine_info(dev)
    assert machine["cpu"] == "AMD EPYC 7B13" and machine["cores"] == 2 and machine["isa"] == "AVX2"
    assert machine["flags"]["avx2"] and not machine["flags"]["avx512_bf16"] and not machine["native_bf16"]
    dtype, reason = resolve_dtype("auto", dev)
    result = {"settings": {"model": "m", "prompts_per_candidate": 16, "max_tokens": 96, "rank": 8, "fast_lora": True,
                           "dtype": dtype, "dtype_reason": reason},
              "machine": machine, "rows": [], "notes": []}
    table = format_table(result)
    assert "AMD EPYC 7B13, 2 cores" in table
    assert "flags: avx2 -avx512f -avx512_bf16 -amx_bf16 -amx_tile -> AVX2; dtype float32 (CPU: AVX2, no native bf16)" in table


@pytest.mark.parametrize("environ", [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "default"}])
def test_aten_capability_alone_does_not_change_the_dtype(tmp_path, environ, caplog):
    """Issue 29d (pytorch 82881): ATEN_CPU_CAPABILITY picks ATen's element-wise kernels, oneDNN's bf16
    GEMMs stay native, so auto keeps bfloat16 and an explicit bfloat16 logs no "emulated" warning."""
    f = tmp_path / "cpuinfo"
    f.write_text(f"model name\t: Fake Xeon\nflags\t\t: {AMX}\n")
    dev = DeviceInfo(cpu=read_cpu_info(f, environ=environ, onednn=True))
    assert dev.cpu.capped_by is None and dev.cpu.native_bf16
    assert resolve_dtype("auto", dev)[0] == "bfloat16"
    caplog.clear()  # only the explicit call's records (an earlier test may have left INFO on)
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("bfloat16", dev)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


@pytest.mark.parametrize("flags", [AMX, AVX512_BF16])
def test_torch_without_onednn_has_no_native_bf16(tmp_path, flags, caplog):
    """Issue 29d: with torch.backends.mkldnn unavailable bf16 matmuls are emulated whatever the flags say."""
    f = tmp_path / "cpuinfo"
    f.write_text(f"model name\t: Fake Xeon\nflags\t\t: {flags}\n")
    info = read_cpu_info(f, environ={}, onednn=False)
    assert not info.native_bf16 and info.summary()["onednn"] is False
    dtype, reason = resolve_dtype("auto", DeviceInfo(cpu=info))
    assert dtype == "float32" and "torch.backends.mkldnn.is_available() is False" in reason
    caplog.clear()  # only the explicit call's records (an earlier test may have left INFO on)
    with caplog.at_level(logging.INFO, logger="essa.hardware"):
        resolve_dtype("bfloat16", DeviceInfo(cpu=info))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_onednn_is_probed_from_torch(tmp_path, monkeypatch):
    import torch

    f = tmp_path / "cpuinfo"
    f.write_text(f"model name\t: Fake Xeon\nflags\t\t: {AMX}\n")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert read_cpu_info(f, environ={}).onednn is False
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    assert read_cpu_info(f, environ={}).native_bf16
