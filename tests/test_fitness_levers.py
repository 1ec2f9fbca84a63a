"""The fitness levers of issue 26 without an engine: the dense reward's cut and its two uses (tie-break,
weighted term), adaptive prompts per generation, and their resume."""
from __future__ import annotations

import numpy as np
import pytest

from engine.evaluation.population import EvalResult, dense_tiebreak, dense_weighted, shaped_fitness
from rewards.likelihood import ANSWER_LEAD, answer_context


@pytest.mark.parametrize("completion, context, close", [
    ("3 + 4 = 7. The final answer is \\boxed{7}.", "3 + 4 = 7. The final answer is \\boxed{", "}."),
    ("a \\boxed{1} then \\boxed{2}$ end", "a \\boxed{1} then \\boxed{", "}$ end"),       # the last box counts
    ("so \\boxed{\\frac{1}{2}}.\n", "so \\boxed{", "}.\n"),                          # nested braces skipped
    ("so \\boxed{12", "so \\boxed{", "}."),                                            # never closed: the taught close
    ("3 + 4 = 7.  ", "3 + 4 = 7." + ANSWER_LEAD, "}."),                                 # no box: the taught format
    ("", ANSWER_LEAD, "}."),
])
def test_answer_context_cuts_at_the_answer(completion, context, close):
    assert answer_context(completion, " 7 ") == (context, "7", close)


def test_dense_target_ends_with_the_token_the_rollout_wrote():
    """issue 40 item 2, on the embedded model's tokenizer: the scored target of a rollout that closed its box
    with ``}.`` is the answer's tokens then the ``}.`` token (one token), not a lone ``}``."""
    from transformers import AutoTokenizer

    from engine.evaluation.prefill import encode_answer_pairs
    from engine.model import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("embedded:smollm2-135m-instruct"))
    text = "3 + 4 = 7. The final answer is \\boxed{7}."
    written = tok(text, add_special_tokens=False)["input_ids"]
    context, answer, close = answer_context(text, "7")
    [(prefix, target)] = encode_answer_pairs(tok, [context], [answer], [close])
    assert prefix + target == written                     # exactly the tokens the rollout wrote
    assert tok.decode(target[-1:]) == "}." and tok.convert_tokens_to_ids("}") not in target


def test_tiebreak_orders_ties_and_never_reverses_a_difference():
    f = np.array([0.5, 0.5, 0.5, 0.25, 0.75, np.nan])
    d = np.array([-1.0, -3.0, -2.0, 5.0, -9.0, 0.0])
    out = dense_tiebreak(f, d)
    assert out[0] > out[2] > out[1]                       # the tied three, in dense order
    assert out[3] < out[1] and out[4] > out[0]            # strict fitness order untouched
    assert np.isnan(out[5])
    np.testing.assert_array_equal(np.argsort(dense_tiebreak(np.full(4, 0.3), [3, 1, 2, 0])), [3, 1, 2, 0])


def test_weighted_adds_prompts_per_std():
    f = np.array([0.5, 0.5])
    out = dense_weighted(f, np.array([-1.0, -3.0]), weight=2.0, prompts=64)
    np.testing.assert_allclose(out, [0.5 + 2 / 64, 0.5 - 2 / 64])
    np.testing.assert_allclose(dense_weighted(f, np.array([1.0, 1.0]), 2.0, 64), f)  # no spread: nothing added


def test_shaped_fitness_leaves_the_centre_out():
    rewards = np.array([[[1.0], [0.0]], [[1.0], [0.0]], [[0.0], [0.0]]])  # (P + centre, N, G)
    dense = np.array([[[-1.0], [-1.0]], [[-5.0], [-5.0]], [[-0.1], [-0.1]]])
    result = EvalResult(rewards.mean(axis=(1, 2)), rewards, {}, dense=dense)
    plain = shaped_fitness(result, 2)
    np.testing.assert_array_equal(plain, [0.5, 0.5])
    tb = shaped_fitness(result, 2, dense="tiebreak")
    assert tb.shape == (2,) and tb[0] > tb[1]
    assert shaped_fitness(EvalResult(result.fitness, rewards, {}), 2, dense="tiebreak").tolist() == [0.5, 0.5]


def test_adaptive_prompts_double_on_noise_and_halve_on_signal():
    from types import SimpleNamespace

    from engine.search.budget import next_prompts

    r = SimpleNamespace(adaptive_prompts=True, noise_rho=0.2, prompts_per_generation=64, max_prompts_per_generation=200)
    assert next_prompts(r, 64, 0.05) == 128 and next_prompts(r, 128, float("nan")) == 200
    assert next_prompts(r, 200, 0.5) == 100 and next_prompts(r, 100, 0.5) == 64
    assert next_prompts(SimpleNamespace(adaptive_prompts=False), 64, -1.0) == 64


@pytest.mark.parametrize("completion, reference, context, answer, close", [
    ("}", "42", "}" + ANSWER_LEAD, "42", "}."),                                        # a lone brace, no box
    ("x \\boxed{\\boxed{42}}.", "42", "x \\boxed{\\boxed{", "42", "}}."),               # a box in a box: the last
    ("\\boxed{{{", "1", "\\boxed{", "1", "}."),                                        # never closed
    ("\\boxed{}}}}", "1", "\\boxed{", "1", "}}}}"),                                    # too many closes
    ("π ≈ \\boxed{3.14} ✓", " π – ½ ", "π ≈ \\boxed{", "π – ½", "} ✓"),                # unicode
    ("\\boxed{a}\\boxed{b", "\\frac{1}{2}", "\\boxed{a}\\boxed{", "\\frac{1}{2}", "}."),  # braces in the reference
])
def test_answer_context_on_odd_completions(completion, reference, context, answer, close):
    assert answer_context(completion, reference) == (context, answer, close)


@pytest.mark.parametrize("reference", ["", "  \n"])
def test_an_empty_reference_is_refused_in_one_line(reference):
    """The dense reward scores log p(reference): an empty one has nothing to score. It failed later in the
    tokenised pairs as "an empty target cannot be scored: '<|im_start|>system\\nYou are a helpful ass' / ''"
    (the prompt's first 40 characters, not what is empty; break-it)."""
    with pytest.raises(ValueError) as e:
        answer_context("so \\boxed{7}.", reference)
    msg = str(e.value)
    assert msg.startswith("the reference answer is empty") and "non-empty answer" in msg and "\n" not in msg
