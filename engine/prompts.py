"""Prompts: the chat messages every back-end (vLLM, transformers, TRL) sees for a problem.

ESSA §4: the system prompt asks the model to reason step by step and box the final answer.
"""
from __future__ import annotations


def chat_messages(question: str, system_prompt: str) -> list[dict[str, str]]:
    """System + user messages for one problem (OpenAI/HF chat format)."""
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return msgs + [{"role": "user", "content": question}]


def build_prompt(tokenizer, question: str, system_prompt: str) -> str:
    """The model's chat template applied to one problem, ending where the assistant starts."""
    return tokenizer.apply_chat_template(chat_messages(question, system_prompt), tokenize=False,
                                         add_generation_prompt=True)
