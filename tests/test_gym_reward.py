"""reasoning-gym tasks and their reward (engine/gym_tasks.py, rewards/gym_reward.py): the reward agrees with the
dataset's own ``score_answer`` on generated problems, the warm-start solutions score correct, the time limit and
the error statuses hold, and the config -> reward mapping picks the verifier (no vLLM, seconds)."""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from engine.config import CONF_DIR, ConfigError, TaskConfig
from rewards import GymReward, MathReward, TrlGymReward, TrlMathReward
from rewards._gym_impl import entry as rebuilt_entry

GYM_TASKS = ("countdown", "basic_arithmetic", "chain_sum", "gsm_symbolic")


def task_cfg(name: str, **overrides):
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v)
    return cfg


def generated(name: str, n: int = 200, seed: int = 1234) -> list[dict]:
    """``n`` entries of the task's reasoning-gym dataset with the options of conf/task/<name>.yaml."""
    import reasoning_gym

    cfg = task_cfg(name)
    return list(reasoning_gym.create_dataset(cfg.gym.dataset, seed=seed, size=n, **dict(cfg.gym.options)))


def wrap(answer: str | None, fmt: str) -> str:
    """A completion that gives ``answer`` in the task's format (None: a completion without an answer)."""
    if answer is None:
        return "Let me think about this step by step: first the tens, then"
    if fmt == "answer_tag":
        return f"<think>Let me try.</think>\n<answer>{answer}</answer>"
    return f"Working it out step by step.\nThe final answer is \\boxed{{{answer}}}."


def cases(name: str, e: dict, other: dict) -> list[tuple[str, str | None]]:
    """(kind, the answer the completion gives) for one entry: right, wrong, malformed."""
    if name == "countdown":
        nums = e["metadata"]["numbers"]
        return [("right", e["answer"]), ("wrong", " + ".join(map(str, nums))),  # every number once, usually not it
                ("wrong", other["answer"]), ("malformed", None), ("malformed", "x + " + e["answer"]),
                ("malformed", f"{e['answer']} = {e['metadata']['target']}"), ("malformed", "")]
    wrong = str(int(float(e["answer"])) + 1)
    return [("right", e["answer"]), ("wrong", wrong), ("wrong", other["answer"]), ("malformed", None),
            ("malformed", f"{e['answer']} apples"), ("malformed", "")]


@pytest.mark.parametrize("name", GYM_TASKS)
def test_reward_agrees_with_the_datasets_own_verifier(name):
    """On 200 generated problems with right, wrong and malformed answers, a completion is correct exactly when
    reasoning-gym's score_answer gives its answer 1.0 on the generated entry; the reward is 1 or 0."""
    import reasoning_gym

    cfg = task_cfg(name)
    ds = reasoning_gym.create_dataset(cfg.gym.dataset, seed=0, size=1)
    entries = generated(name)
    rows = [(kind, answer, e) for i, e in enumerate(entries)
            for kind, answer in cases(name, e, entries[(i + 1) % len(entries)])]
    reward = GymReward(cfg.gym.dataset, cfg.gym.answer_format)
    results = reward([wrap(a, cfg.gym.answer_format) for _, a, _ in rows], [e["answer"] for _, _, e in rows])
    for (kind, answer, e), res in zip(rows, results):
        expected = ds.score_answer(answer or None, e)  # the generated entry, not the one the reward rebuilds
        assert (res.status == "correct") == (expected == 1.0), (kind, answer, e["answer"], res, expected)
        assert res.reward == float(expected == 1.0), (kind, answer, res)
        if kind == "right":
            assert res.status == "correct" and res.extracted == answer
        if answer is None:
            assert res.status == "no_answer" and res.extracted is None
    assert sum(r.status == "correct" for r in results) >= 200


def test_countdown_entries_rebuilt_from_the_reference_match_the_generated_ones():
    for e in generated("countdown", 300, seed=7):
        got = rebuilt_entry("countdown", e["answer"])["metadata"]
        assert sorted(got["numbers"]) == sorted(e["metadata"]["numbers"]) and got["target"] == e["metadata"]["target"]


@pytest.mark.parametrize("name", GYM_TASKS)
def test_warm_start_solutions_score_correct_and_splits_are_deterministic(name):
    from engine.tasks import load_task

    cfg = task_cfg(name, train_size=60, val_size=30)
    task = load_task(cfg)
    assert load_task(cfg).train == task.train  # deterministic per task.seed
    assert {p.question for p in task.val}.isdisjoint(p.question for p in task.train)
    assert load_task(task_cfg(name, train_size=60, val_size=30, seed=1)).val != task.val
    assert all(p.solution for p in task.train) and task.train[0].id == f"{name}/train/0"
    reward = GymReward(cfg.gym.dataset, cfg.gym.answer_format, format_weight=0.1)
    results = reward([p.solution for p in task.train], [p.answer for p in task.train])
    assert all(r.status == "correct" and r.reward == pytest.approx(1.1) for r in results), results[:3]


def test_countdown_prompt_and_solution_follow_es_at_scale():
    from engine.tasks import load_task
    from rewards.gym_reward import tag_format_score

    task = load_task(task_cfg("countdown", train_size=5, val_size=5))
    p = task.val[0]
    assert p.question.startswith("Using the numbers [") and "create an equation that equals" in p.question
    assert p.question.endswith("for example <answer> (1 + 2) / 3 </answer>.")
    assert p.solution.startswith("<think>\n") and p.solution.endswith(f"</think>\n<answer>{p.answer}</answer>")
    assert tag_format_score(p.solution) == 1.0
    assert tag_format_score("<think>a</think> <answer>1</answer>") == pytest.approx(0.6)
    assert tag_format_score("<answer>1</answer>") == 0.5 and tag_format_score("1 + 2") == 0.0


def test_time_limit_and_error_statuses():
    reward = GymReward("countdown", "answer_tag", timeout_s=0.5)
    refs = ["90 - 58 + 35", "90 - 58 + 35", "", "not an expression", "90 - 58 + 35"]
    results = reward(["<answer>9**9**9**9**9</answer>", "<answer>90 + 35 - 58</answer>", "<answer>1</answer>",
                      "<answer>1</answer>", 12], refs)
    assert [r.status for r in results] == ["timeout", "correct", "error", "error", "error"]
    assert results[0].reward == 0.0 and all(math.isnan(r.reward) for r in results[2:])
    assert reward(["<answer>__import__('os').system('x')</answer>"], refs[:1])[0].status == "wrong"  # never evaluated
    with pytest.raises(ValueError, match="one reference per completion"):
        reward(["a"], [])


def test_boxed_answers_follow_the_math_rules():
    reward = GymReward("chain_sum", "boxed", format_weight=0.25)
    results = reward(["\\boxed{6} or \\boxed{7}", "The answer is \\boxed{6}.", "6", "\\boxed{6"], ["6"] * 4)
    assert [r.status for r in results] == ["wrong", "correct", "no_answer", "no_answer"]
    assert results[1].reward == 1.25 and results[0].reward == 0.0
    assert GymReward("chain_sum", lenient=True)(["so 6"], ["6"])[0].status == "correct"


def test_trl_signature():
    trl = TrlGymReward("chain_sum")
    assert trl.__name__ == "chain_sum_reward"
    assert trl(["\\boxed{6}", "\\boxed{5}", "\\boxed{6}"], answer=["6", "6", ""]) == [1.0, 0.0, None]
    with pytest.raises(KeyError, match="'answer' or 'solution'"):
        trl(["\\boxed{6}"], prompts=["q"])


def test_task_reward_maps_the_task_to_its_verifier():
    from engine.config import RewardConfig
    from engine.evaluation.build import task_reward

    reward = OmegaConf.structured(RewardConfig(timeout_s=2.0, format_weight=0.1))
    gym = task_reward(task_cfg("countdown"), reward)
    assert type(gym) is GymReward and (gym.dataset, gym.answer_format, gym.timeout_s, gym.format_weight) == \
        ("countdown", "answer_tag", 2.0, 0.1)
    assert type(task_reward(task_cfg("countdown"), reward, trl=True)) is TrlGymReward
    assert task_reward(task_cfg("chain_sum"), reward, lenient=True, format_weight=0.0).lenient is True
    math_task = OmegaConf.merge(OmegaConf.structured(TaskConfig), {"name": "gsm8k", "reader": "gsm8k"})
    assert type(task_reward(math_task, reward)) is MathReward
    assert type(task_reward(math_task, reward, trl=True)) is TrlMathReward
    with pytest.raises(ConfigError, match="task.reward=reasoning_gym needs task.gym.dataset"):
        task_reward(OmegaConf.merge(math_task, {"reward": "reasoning_gym"}), reward)
    with pytest.raises(ConfigError, match="task.reward='verl': use one of math, reasoning_gym"):
        task_reward(OmegaConf.merge(math_task, {"reward": "verl"}), reward)


def test_a_bad_dataset_option_is_one_line():
    from engine.tasks import load_task

    with pytest.raises(ValueError) as e:
        load_task(task_cfg("chain_sum", **{"gym.options": {"min_terms": 5, "max_terms": 2}}))
    msg = str(e.value)
    assert msg.startswith("task.gym: reasoning-gym cannot make dataset 'chain_sum'") and "\n" not in msg
    with pytest.raises(ValueError, match="task.gym: reasoning-gym cannot make dataset 'no_such_set'"):
        load_task(task_cfg("chain_sum", **{"gym.dataset": "no_such_set"}))
