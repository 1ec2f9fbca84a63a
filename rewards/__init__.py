"""Final-answer extraction and checking for math completions.

Evolution strategies climb whatever the reward pays for, so this package is built to be
hard to fool: strict extraction (`rewards.extract`), every distinct boxed answer must be
right, hedges score 0, reasoning inside ``<think>`` is ignored, nothing is ever passed to
``eval``/``exec``, and every symbolic check runs in a worker process with a hard time limit
(`rewards._pool`). Plain numbers and text answers are decided in-process without sympy
(`rewards.numeric`); the rest goes to HF math-verify (`rewards._verify_impl`).

Public API:
    RewardResult, MathReward, reward        batched scoring (`rewards.math_reward`)
    extract_answer                          the final answer of one completion
    GymReward                               a reasoning-gym dataset's own verifier (`rewards.gym_reward`)
    trl_math_reward, TrlMathReward          TRL reward-function signature
    TrlGymReward                            GymReward with TRL's signature
    compute_score                           verl ``compute_score`` signature

Importing this package is cheap: no sympy, no process is started until a non-numeric
answer needs checking.
"""

from rewards.adapters import TrlGymReward, TrlMathReward, compute_score, trl_math_reward
from rewards.extract import extract_answer
from rewards.gym_reward import GymReward
from rewards.math_reward import MathReward, RewardResult, Status, reward

__all__ = [
    "GymReward",
    "MathReward",
    "RewardResult",
    "Status",
    "TrlGymReward",
    "TrlMathReward",
    "compute_score",
    "extract_answer",
    "reward",
    "trl_math_reward",
]
