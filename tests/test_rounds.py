"""Training in rounds (issue 39; engine/commands/train_rounds.py): the fold's rows, each round's config,
the loop's resume, and the config's one-line refusals. The loop runs here with a small fake in place of
one round's `essa train` and of the fold's SFT; tests/test_pipeline.py runs rounds through vLLM and TRL."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from engine.commands import train_rounds
from engine.commands.train_config import TrainConfig, check_rounds
from engine.config import ConfigError
from engine.tasks import Problem


def problems(n: int) -> dict[str, Problem]:
    return {f"p{i}": Problem(id=f"p{i}", question=f"q{i}", answer=str(i), solution="worked") for i in range(n)}


def row(pid: str, text: str, status: str = "correct") -> dict:
    return {"prompt_id": pid, "completion": text, "status": status}


def test_fold_rows_are_the_distinct_correct_completions_one_per_problem_first():
    rollouts = [row("p0", "a"), row("p0", "a"), row("p0", "b"), row("p1", "c"), row("p1", "x", "wrong"),
                row("p2", "y", "wrong"), row("p3", "  ", "correct")]
    rows = train_rounds.fold_rows(rollouts, problems(4), max_rows=10, seed=0)
    texts = sorted((r.id, r.solution) for r in rows)
    assert texts == [("p0", "a"), ("p0", "b"), ("p1", "c")]  # wrong, blank and duplicate texts left out
    assert {r.id for r in rows[:2]} == {"p0", "p1"}  # every problem once before any second completion
    assert rows[0].question == problems(4)[rows[0].id].question  # the problem's own prompt
    first_p0 = next(r for r in rows if r.id == "p0")
    assert first_p0.solution == "a"  # its most frequent correct text first


def test_fold_rows_cap_and_seeded_order():
    rollouts = [row(f"p{i}", f"t{i}") for i in range(20)]
    a = train_rounds.fold_rows(rollouts, problems(20), max_rows=5, seed=1)
    b = train_rounds.fold_rows(rollouts, problems(20), max_rows=5, seed=1)
    c = train_rounds.fold_rows(rollouts, problems(20), max_rows=5, seed=2)
    assert len(a) == 5 and [r.id for r in a] == [r.id for r in b]
    assert [r.id for r in a] != [r.id for r in c]
    assert train_rounds.fold_rows([row("p0", "t", "wrong")], problems(1), 5, 0) == []
    with pytest.raises(KeyError):
        train_rounds.fold_rows([row("gone", "t")], problems(1), 5, 0)


def cfg(**kw):
    c = OmegaConf.structured(TrainConfig)
    c.merge_with(OmegaConf.create(kw))
    return c


def test_round_config_seeds_starts_and_resumes(tmp_path: Path):
    base = cfg(seed=3, rounds={"count": 3})
    r0 = train_rounds.round_config(base, 0, None, tmp_path / "round_0")
    assert r0.seed == 3 and r0.sft.adapter is None and r0.resume is None and r0.rounds.count == 1
    (tmp_path / "round_1").mkdir()
    (tmp_path / "round_1" / "checkpoint.pkl").write_bytes(b"x")
    r1 = train_rounds.round_config(base, 1, tmp_path / "fold_0", tmp_path / "round_1")
    assert r1.seed == 3 + train_rounds.ROUND_SEED_STRIDE and r1.sft.adapter == str(tmp_path / "fold_0")
    assert r1.resume == str(tmp_path / "round_1") and not r1.rollout.placebo
    assert base.rounds.count == 3 and base.sft.adapter is None  # the command's own config is untouched
    ctl = train_rounds.round_config(cfg(rounds={"count": 2, "control": True, "control_temperature": 0.9}),
                                    1, tmp_path / "fold_0", tmp_path / "round_9")
    assert ctl.rollout.placebo and not ctl.rollout.common_seeds and ctl.rollout.temperature == 0.9


class FakeRounds:
    """One round's `essa train` and the fold's SFT as small fakes: each round writes a summary.json whose
    mean accuracy is 0.1 more than its start's, each fold an adapter directory."""

    def __init__(self, monkeypatch, interrupt_at: int | None = None):
        self.calls, self.folds, self.interrupt_at = [], [], interrupt_at
        monkeypatch.setattr(train_rounds, "fold_round", self.fold_round)

    def run_train(self, cfg_r, round_dir: Path):
        self.calls.append((Path(round_dir).name, cfg_r.sft.adapter, cfg_r.resume, cfg_r.seed))
        if self.interrupt_at == len(self.calls) - 1:
            (Path(round_dir)).mkdir(parents=True, exist_ok=True)
            (Path(round_dir) / "checkpoint.pkl").write_bytes(b"gen 0")
            raise KeyboardInterrupt
        start = 0.0 if cfg_r.sft.adapter is None else json.loads((Path(cfg_r.sft.adapter) / "acc.json").read_text())
        Path(round_dir).mkdir(parents=True, exist_ok=True)
        (Path(round_dir) / "summary.json").write_text(json.dumps({"val": {"sft": start, "mean": start + 0.1}}))

    def fold_round(self, cfg, r, round_dir, out):
        self.folds.append(r)
        out.mkdir(parents=True, exist_ok=True)
        mean = json.loads((round_dir / "summary.json").read_text())["val"]["mean"]
        (out / "acc.json").write_text(json.dumps(mean))
        return {"rows": 7, "steps": 1, "last_loss": 0.5}


def test_rounds_chain_each_fold_into_the_next_round(tmp_path, monkeypatch, capsys):
    fake = FakeRounds(monkeypatch)
    out = train_rounds.run_rounds(cfg(rounds={"count": 3}), tmp_path, fake.run_train)
    assert [c[0] for c in fake.calls] == ["round_0", "round_1", "round_2"] and fake.folds == [0, 1]
    assert [c[1] for c in fake.calls] == [None, str(tmp_path / "fold_0"), str(tmp_path / "fold_1")]
    assert [e["val"]["mean"] for e in out["rounds"]] == pytest.approx([0.1, 0.2, 0.3])
    assert "fold" not in out["rounds"][-1]  # the last round is not folded
    saved = json.loads((tmp_path / "rounds.json").read_text())
    assert saved["rounds"][1]["fold"]["rows"] == 7 and len(saved["rounds"]) == 3
    assert "round  start   mean" in capsys.readouterr().out


def test_rounds_resume_skips_finished_rounds_and_resumes_the_interrupted_one(tmp_path, monkeypatch, capsys):
    fake = FakeRounds(monkeypatch, interrupt_at=1)
    with pytest.raises(KeyboardInterrupt):
        train_rounds.run_rounds(cfg(rounds={"count": 3}), tmp_path, fake.run_train)
    said = capsys.readouterr().err.strip().splitlines()[-1]  # the last line: the rounds', not the round's
    assert f"interrupted in round 1; continue the rounds with: essa train resume={tmp_path} " in said
    assert json.loads((tmp_path / "rounds.json").read_text())["rounds"][0]["round"] == 0
    again = FakeRounds(monkeypatch)
    out = train_rounds.run_rounds(cfg(rounds={"count": 3}, resume=str(tmp_path)), tmp_path / "elsewhere",
                                  again.run_train)
    assert [c[0] for c in again.calls] == ["round_1", "round_2"]  # round 0 finished: not run again
    assert again.calls[0][2] == str(tmp_path / "round_1")  # resumed from its checkpoint
    assert again.calls[1][2] is None
    assert [e["val"]["mean"] for e in out["rounds"]] == pytest.approx([0.1, 0.2, 0.3])


def test_resume_of_a_directory_without_rounds_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="resume=.*no rounds.json"):
        train_rounds.rounds_dir(cfg(rounds={"count": 2}, resume=str(tmp_path)), tmp_path)


@pytest.mark.parametrize("kw, field", [
    ({"rounds": {"count": 0}}, "rounds.count"),
    ({"rounds": {"count": 1, "control": True}}, "rounds.control"),
    ({"rounds": {"count": 2, "max_rows": 0}}, "rounds.max_rows"),
    ({"rounds": {"count": 2, "fold_steps": 0}}, "rounds.fold_steps"),
    ({"rounds": {"count": 2, "fold_lr": -1.0}}, "rounds.fold_lr"),
    ({"rounds": {"count": 2, "control": True, "control_temperature": 0.0}}, "rounds.control_temperature"),
    ({"rounds": {"count": 2}, "deadline_s": 600.0}, "deadline_s"),
    ({"rounds": {"count": 2}, "time_budget_s": 600.0}, "time_budget_s"),
    ({"rounds": {"count": 2}, "rollout": {"placebo": True}}, "rollout.placebo"),
    ({"rounds": {"count": 2}, "generations": 0}, "generations"),
    ({"rounds": {"count": 2}, "sft": {"enabled": False}}, "sft.enabled"),
])
def test_bad_rounds_are_one_line_naming_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        check_rounds(cfg(**kw))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_plain_run_and_good_rounds_pass():
    check_rounds(cfg())
    check_rounds(cfg(rounds={"count": 3, "control": True}))


def test_given_adapter_is_checked_against_the_lora_group(tmp_path):
    from engine.config import LoRAConfig
    from engine.lora.sft import given_adapter

    lora = LoRAConfig(rank=8, alpha=16.0)
    with pytest.raises(ConfigError, match="sft.adapter=.*adapter_config.json missing"):
        given_adapter(tmp_path, lora)
    good = {"r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj", "k_proj", "o_proj"]}
    for change, fix in [({"r": 4}, "lora.rank=4"), ({"lora_alpha": 32}, "lora.alpha=32.0"),
                        ({"target_modules": ["q_proj"]}, "lora.target_modules=[q_proj]")]:
        (tmp_path / "adapter_config.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ConfigError, match=fix.replace("[", r"\[").replace("]", r"\]")) as e:
            given_adapter(tmp_path, lora)
        assert "\n" not in str(e.value)
    (tmp_path / "adapter_config.json").write_text(json.dumps(good))
    assert given_adapter(tmp_path, lora) == tmp_path


@pytest.mark.parametrize("kw, field", [
    ({"rollout": {"fitness": "likelihood"}}, "rollout.fitness"),
    ({"rounds": {"count": 2, "control": True}, "rollout": {"adaptive_prompts": True}}, "rollout.adaptive_prompts"),
    ({"seed": 2 ** 32 - 1}, "seed="),
])
def test_rounds_refuse_what_would_fail_after_round_0(kw, field):
    kw = {"rounds": {"count": 2}, **kw}
    with pytest.raises(ConfigError, match=field):
        check_rounds(cfg(**kw))


def test_a_stop_in_round_0_resumes_and_a_changed_config_is_refused(tmp_path, monkeypatch):
    fake = FakeRounds(monkeypatch, interrupt_at=0)
    with pytest.raises(KeyboardInterrupt):
        train_rounds.run_rounds(cfg(rounds={"count": 2}), tmp_path, fake.run_train)
    assert json.loads((tmp_path / "rounds.json").read_text())["rounds"] == []  # written before round 0
    with pytest.raises(ConfigError, match="rounds.control=false"):
        train_rounds.run_rounds(cfg(rounds={"count": 2, "control": True}, resume=str(tmp_path)), tmp_path,
                                FakeRounds(monkeypatch).run_train)
    again = FakeRounds(monkeypatch)
    out = train_rounds.run_rounds(cfg(rounds={"count": 2}, resume=str(tmp_path)), tmp_path, again.run_train)
    assert again.calls[0][:3] == ("round_0", None, str(tmp_path / "round_0"))  # resumed from its checkpoint
    assert [e["round"] for e in out["rounds"]] == [0, 1]


def test_a_finished_fold_is_kept_without_reading_the_task(tmp_path):
    out = tmp_path / "fold_0"
    out.mkdir()
    (out / "adapter_config.json").write_text("{}")
    (out / "sft_meta.json").write_text(json.dumps({"examples": 12, "steps": 3, "last_loss": 0.2}))
    bad_task = cfg(rounds={"count": 2}, task={"name": "nope", "reader": "nope"})
    assert train_rounds.fold_round(bad_task, 0, tmp_path / "round_0", out) == {"rows": 12, "steps": 3, "last_loss": 0.2}
