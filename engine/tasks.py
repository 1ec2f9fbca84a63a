"""Tasks: math problems with reference answers and worked solutions.

A task yields ``Problem`` rows split into ``train`` (SFT warm start and ES minibatches) and
``val`` (held-out validation). Built-in readers:

| name | source | answer | worked solution |
|---|---|---|---|
| ``gsm8k`` | ``question``/``answer`` JSONL or Parquet | text after ``#### `` | the answer text, calculator marks removed |
| ``math500`` | ``problem``/``solution``/``answer`` | ``answer`` | ``solution`` |
| ``svamp`` | ``Body``/``Question``/``Answer``/``Equation`` | ``Answer`` | built from ``Equation`` |
| ``jsonl`` | any file, fields mapped in config | ``answer_field`` | ``solution_field`` (optional) |
| ``arithmetic`` | generated, deterministic per seed | exact integer | generated step by step |

Every worked solution ends in ``The final answer is \\boxed{answer}.`` (ESSA §4: the system prompt
asks the model to reason step by step and box the answer). Rows without a usable answer are
skipped and counted in ``Task.skipped``; they never crash the run. A JSONL line that is not JSON at
all is a broken file, not a row without an answer: reading stops with an error naming the line.
"""
from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Problem:
    """One math problem.

    Attributes:
        id: stable identifier (``<task>/<split>/<row>``).
        question: the text shown to the model.
        answer: reference final answer (a string: number or LaTeX).
        solution: worked solution ending in ``\\boxed{answer}``, or None when the source has none.
    """

    id: str
    question: str
    answer: str
    solution: str | None = None


@dataclass
class Task:
    """Problems of one task split into train and held-out validation rows."""

    name: str
    train: list[Problem]
    val: list[Problem]
    skipped: dict[str, int] = field(default_factory=dict)


def boxed_ending(answer: str) -> str:
    """The sentence every worked solution ends with."""
    return f"The final answer is \\boxed{{{answer}}}."


def default_data_root() -> Path:
    """``$ESSA_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("ESSA_DATA", REPO_ROOT.parent / "shared" / "data"))


def _resolve_path(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    for base in (Path.cwd(), REPO_ROOT, default_data_root()):
        if (base / p).exists():
            return base / p
    return default_data_root() / p


def _unreadable(field: str, path: Path, e: OSError) -> ValueError:
    """The one-line error for a data file that exists but cannot be read (permissions, I/O error)."""
    return ValueError(f"{field}: cannot read {path} ({e.strerror or type(e).__name__}); "
                      f"fix its permissions or point {field} at a readable file")


def read_rows(path: Path, field: str = "task.path") -> list[dict[str, Any]]:
    """Rows of a JSONL, JSON-array or Parquet file.

    Args:
        path: the file.
        field: the config field that named it (error messages name it).

    Raises:
        FileNotFoundError: missing file. ValueError: a directory or an unreadable file (permissions,
            I/O error), unsupported suffix, a text file that is not
            UTF-8, a JSON array that does not parse, a JSONL line that is not valid JSON (the
            message names the file and the 1-based line numbers), or a Parquet file pyarrow
            cannot read.
    """
    if not path.exists():
        raise FileNotFoundError(f"{field}: {path} does not exist; point {field} at a JSONL/Parquet file or folder")
    if path.is_dir():
        raise ValueError(f"{field}: {path} is a directory where a data file was expected; point {field} at a "
                         f".jsonl/.parquet file, or at a folder holding <split>.jsonl/<split>.parquet files")
    if path.suffix == ".parquet":
        from engine.io import read_rows as read_parquet
        try:
            return read_parquet(path)
        except ValueError as e:
            raise ValueError(f"{field}: {e}; fix the file or point {field} at a valid .parquet/.jsonl file") from None
        except OSError as e:
            raise _unreadable(field, path, e) from None
    if path.suffix in (".jsonl", ".json"):
        try:
            text = path.read_text(encoding="utf-8-sig")  # -sig: a leading UTF-8 BOM (Windows editors) is dropped
        except OSError as e:
            raise _unreadable(field, path, e) from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{field}: {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                             f"the file must be UTF-8 JSONL; re-encode it as UTF-8") from None
        if path.suffix == ".json" and text.lstrip().startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{field}: {path} is not a valid JSON array ({e.msg} at line {e.lineno}); "
                                 f"fix the file or use JSONL (one object per line)") from None
        rows, bad = [], []  # bad: (1-based line number, decoder message)
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                bad.append((lineno, e.msg))
        if len(bad) == 1:
            raise ValueError(f"{field}: {path} line {bad[0][0]} is not valid JSON ({bad[0][1]}); "
                             f"fix or delete the line")
        if bad:
            shown = ", ".join(str(n) for n, _ in bad[:10]) + (", ..." if len(bad) > 10 else "")
            raise ValueError(f"{field}: {path} has {len(bad)} lines that are not valid JSON (lines {shown}; "
                             f"line {bad[0][0]}: {bad[0][1]}); fix or delete those lines")
        return rows
    raise ValueError(f"{field}: {path} has unsupported suffix {path.suffix!r}; use .jsonl, .json or .parquet")


def _split_file(root: Path, split: str) -> Path:
    if root.is_file():
        return root
    for suffix in (".jsonl", ".parquet", ".json"):
        if (root / f"{split}{suffix}").exists():
            return root / f"{split}{suffix}"
    raise FileNotFoundError(f"task.path: no {split}.jsonl or {split}.parquet in {root}; set task.train_split/task.val_split")


def _number(x: Any) -> str | None:
    """Render a numeric answer without a spurious ``.0``; None when not a finite number."""
    try:
        v = float(str(x).replace(",", "").strip())
    except (TypeError, ValueError):
        return None
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return str(int(v)) if v == int(v) else repr(v)


def _gsm8k(row: dict) -> tuple[str, str, str | None] | None:
    q, a = row.get("question"), row.get("answer")
    if not isinstance(q, str) or not isinstance(a, str) or "####" not in a:
        return None
    body, _, final = a.rpartition("####")
    final = final.strip().replace(",", "")
    if not final:
        return None
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return q.strip(), final, f"{body}\n{boxed_ending(final)}"


def _math500(row: dict) -> tuple[str, str, str | None] | None:
    q, ans, sol = row.get("problem"), row.get("answer"), row.get("solution")
    if not isinstance(q, str) or not isinstance(ans, str) or not ans.strip():
        return None
    return q.strip(), ans.strip(), (f"{sol.strip()}\n{boxed_ending(ans.strip())}" if isinstance(sol, str) else None)


def _svamp(row: dict) -> tuple[str, str, str | None] | None:
    body, q, ans = row.get("Body"), row.get("Question"), _number(row.get("Answer"))
    if not isinstance(body, str) or not isinstance(q, str) or ans is None:
        return None
    eq = row.get("Equation")
    sol = None
    if isinstance(eq, str) and eq.strip():
        expr = re.sub(r"(\d+)\.0\b", r"\1", eq.strip())
        sol = f"We compute {expr} = {ans}.\n{boxed_ending(ans)}"
    return f"{body.strip()} {q.strip()}", ans, sol


def _generic(question_field: str, answer_field: str, solution_field: str | None) -> Callable:
    def read(row: dict):
        q, a = row.get(question_field), row.get(answer_field)
        if not isinstance(q, str) or a is None or str(a).strip() == "":
            return None
        a = _number(a) if isinstance(a, (int, float)) else str(a).strip()
        if a is None:
            return None
        s = row.get(solution_field) if solution_field else None
        return q.strip(), a, (f"{s.strip()}\n{boxed_ending(a)}" if isinstance(s, str) and s.strip() else None)
    return read


READERS: dict[str, Callable[[dict], tuple[str, str, str | None] | None]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "svamp": _svamp,
}
# The fields each built-in reader needs, and what a usable row holds in them (error messages).
READER_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "gsm8k": (("question", "answer"), "a text question and an answer ending in '#### <final answer>'"),
    "math500": (("problem", "answer"), "a text problem and a non-empty text answer"),
    "svamp": (("Body", "Question", "Answer"), "text Body and Question and a numeric Answer"),
}


def no_usable_rows(task: str, source: str, rows: list, reader: str, expected: tuple[str, ...],
                   usable: str) -> ValueError:
    """The one-line error for a data source none of whose rows the reader could use.

    Args:
        task: the task name. source: the file (or hub split) the rows came from.
        rows: the rows read. reader: ``task.reader``. expected: the fields the reader needs.
        usable: what a usable row holds in those fields.

    Returns:
        A ValueError naming the source, the expected fields, the fields found in its rows and the fix.
    """
    if not rows:
        return ValueError(f"task {task!r}: no usable rows in {source} (it has none); fill it with objects holding "
                          f"{', '.join(expected)}, or point task.path at another file")
    found = sorted({str(k) for r in rows if isinstance(r, dict) for k in r})
    shown = ", ".join(found[:12]) + (f", ... ({len(found)} in all)" if len(found) > 12 else "")
    if not found:
        shown = "no fields (no row is a JSON object)"
    missing = [f for f in expected if f not in found]
    if not missing:
        fix = "the fields are there but none of their values is usable; fix the values"
    elif reader == "jsonl":
        fix = "set task.question_field and task.answer_field to the file's field names"
    else:
        fix = (f"rename the file's fields to {', '.join(expected)}, or use task.reader=jsonl with "
               f"task.question_field=<field> task.answer_field=<field>")
    return ValueError(f"task {task!r}: no usable rows in {source} ({len(rows)} read): task.reader={reader} expects "
                      f"fields {', '.join(expected)} ({usable}), found {shown}; {fix}")


# --- generated arithmetic word problems -------------------------------------------------------

_NAMES = ["Ana", "Ben", "Chloe", "Dev", "Ema", "Finn", "Gita", "Hugo", "Ivy", "Jon", "Kai", "Lea"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards"]


def arithmetic_problem(rng: random.Random, steps: int, max_value: int) -> tuple[str, str, str]:
    """One multi-step word problem of additions and subtractions (no negative intermediate).

    Args:
        rng: the random stream (deterministic per seed).
        steps: number of operations after the starting amount.
        max_value: operands are drawn from [1, max_value].

    Returns:
        (question, answer, worked solution ending in ``\\boxed{answer}``).
    """
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(2, max_value)
    sentences = [f"{name} has {total} {item}."]
    work = [f"{name} starts with {total} {item}."]
    for _ in range(steps):
        if total > 1 and rng.random() < 0.5:
            n = rng.randint(1, min(max_value, total - 1))
            sentences.append(rng.choice([f"{name} gives away {n}.", f"{name} loses {n}."]))
            work.append(f"{total} - {n} = {total - n}.")
            total -= n
        else:
            n = rng.randint(1, max_value)
            sentences.append(rng.choice([f"{name} finds {n} more.", f"A friend gives {name} {n} more."]))
            work.append(f"{total} + {n} = {total + n}.")
            total += n
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    return question, str(total), " ".join(work) + f"\n{boxed_ending(total)}"


def _arithmetic(cfg) -> Task:
    def make(split: str, n: int) -> list[Problem]:
        rng = random.Random(f"{cfg.seed}-{split}")
        return [Problem(f"arithmetic/{split}/{i}", *arithmetic_problem(rng, cfg.steps, cfg.max_value))
                for i in range(n)]
    return Task("arithmetic", make("train", cfg.train_size or 2000), make("val", cfg.val_size))


def _check_sizes(cfg) -> None:
    if cfg.val_size < 1:
        raise ConfigError(f"task.val_size={cfg.val_size}: must be >= 1 (held-out problems for validation); "
                          f"e.g. task.val_size=100")
    if cfg.train_size < 0:
        raise ConfigError(f"task.train_size={cfg.train_size}: must be >= 0 (0 = all rows); e.g. task.train_size=0")


def _hub_rows(hub_id: str, hub_config: str | None, split: str) -> list[dict]:
    """Rows of one split of a Hugging Face dataset.

    Raises:
        ValueError: the hub cannot be reached (no network, offline mode) or has no such dataset;
            the message names task.hub_id and the fix (a local task.path).
    """
    import datasets

    try:
        return list(datasets.load_dataset(hub_id, hub_config, split=split))
    except (ConnectionError, OSError, TimeoutError) as e:  # requests' ConnectionError is an OSError
        if isinstance(e, datasets.exceptions.DatasetNotFoundError):
            why = "no such dataset on the hub (or it is private)"
        else:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(f"task.hub_id={hub_id!r}: cannot load split {split!r} from the Hugging Face hub ({why}); "
                         f"check the network and the id, or set task.hub_id=null and task.path=<a local "
                         f"JSONL/Parquet file or folder>") from None


def _reader_of(cfg) -> tuple[Callable, tuple[str, ...], str]:
    """``task.reader`` -> (row parser, the fields it expects, what a usable row is).

    Raises:
        ValueError: an unknown reader.
    """
    if cfg.reader in READERS:
        return READERS[cfg.reader], *READER_FIELDS[cfg.reader]
    if cfg.reader == "jsonl":
        return (_generic(cfg.question_field, cfg.answer_field, cfg.solution_field),
                (cfg.question_field, cfg.answer_field), "a text question and a non-empty answer")
    raise ValueError(f"task.reader={cfg.reader!r} is unknown; use one of {sorted(READERS) + ['jsonl', 'arithmetic']}")


def _local_root(cfg) -> Path | None:
    """``task.path`` resolved (None with ``task.hub_id``).

    Raises:
        ConfigError: an empty path. FileNotFoundError: a path that does not exist.
    """
    if cfg.hub_id:
        return None
    if not str(cfg.path or "").strip():
        raise ConfigError(f"task.path is empty for task {cfg.name!r}; set task.path (a JSONL/Parquet file or "
                          f"folder) or task.hub_id")
    root = _resolve_path(cfg.path)
    if not root.exists():
        raise FileNotFoundError(f"task.path={cfg.path!r}: {root} does not exist (relative paths are looked up in "
                                f"the working directory, the repository and $ESSA_DATA); fix task.path")
    return root


class _Source:
    """The splits of one task source (local files under ``root`` or the hub), parsed into problems;
    counts the rows it skips per split."""

    def __init__(self, cfg, root: Path | None):
        self.cfg, self.root = cfg, root
        self.reader, self.expected, self.usable_row = _reader_of(cfg)
        self.skipped: dict[str, int] = {}

    def problems(self, split: str) -> list[Problem]:
        """Every usable row of ``split`` as a Problem (id ``<task>/<split>/<row>``).

        Raises:
            ValueError: the split has no usable row (one line naming the source and the fields).
        """
        cfg = self.cfg
        if cfg.hub_id:
            source, rows = f"task.hub_id={cfg.hub_id!r} split {split!r}", _hub_rows(cfg.hub_id, cfg.hub_config, split)
        else:
            path = _split_file(self.root, split)
            source, rows = str(path), read_rows(path)
        out = []
        for i, row in enumerate(rows):
            parsed = self.reader(row) if isinstance(row, dict) else None
            if parsed is None:
                self.skipped[split] = self.skipped.get(split, 0) + 1
                continue
            out.append(Problem(f"{cfg.name}/{split}/{i}", *parsed))
        if not out:
            raise no_usable_rows(cfg.name, source, rows, cfg.reader, self.expected, self.usable_row)
        return out


def _carve_held_out(cfg, source: _Source) -> tuple[list[Problem], list[Problem]]:
    """One source for both splits: the first ``val_size`` shuffled rows are held out, and train drops
    every row whose question is also held out, so train never sees a held-out question."""
    problems = source.problems(cfg.train_split)
    if 0 < len(problems) <= cfg.val_size:
        raise ConfigError(f"task.val_size={cfg.val_size} holds out all {len(problems)} usable rows of the one "
                          f"split, leaving none to train on; lower task.val_size")
    random.Random(cfg.seed).shuffle(problems)
    val, train = problems[: cfg.val_size], problems[cfg.val_size:]
    held_out = {p.question for p in val}
    kept = [p for p in train if p.question not in held_out]
    if len(kept) < len(train):
        source.skipped["train (question also in val)"] = len(train) - len(kept)
    return kept, val


def load_task(cfg) -> Task:
    """Load a task from its config (``conf/task/*.yaml``, schema ``engine.config.TaskConfig``).

    Local files: ``task.path`` (a folder with ``<split>.jsonl``/``.parquet`` or one file);
    relative paths are looked up from the working directory, the repository and ``$ESSA_DATA``.
    Hub: ``task.hub_id`` loads through ``datasets`` when a hub is reachable.
    When the source has one split only (``train_split == val_split``, or ``task.path`` is one file),
    the rows are shuffled with ``task.seed`` and the first ``val_size`` become the held-out split;
    train rows whose question is also a held-out question are dropped (counted in ``skipped``).

    Raises:
        ConfigError: ``task.val_size`` < 1 or ``task.train_size`` < 0.
        FileNotFoundError / ValueError: missing or unreadable source, unknown reader, or no usable rows.
    """
    _check_sizes(cfg)
    if cfg.name == "arithmetic" or cfg.reader == "arithmetic":
        return _arithmetic(cfg)
    _reader_of(cfg)  # an unknown reader fails before the path is looked at
    root = _local_root(cfg)
    source = _Source(cfg, root)
    if cfg.train_split == cfg.val_split or (root is not None and root.is_file()):
        train, val = _carve_held_out(cfg, source)
    else:
        train = source.problems(cfg.train_split)
        val = source.problems(cfg.val_split)
        random.Random(cfg.seed).shuffle(val)
        val = val[: cfg.val_size]
    if cfg.train_size:
        train = train[: cfg.train_size]
    if not train or not val:
        raise ValueError(f"task {cfg.name!r}: no usable rows (train {len(train)}, val {len(val)}, "
                         f"skipped {source.skipped}); check task.path and the field names")
    return Task(cfg.name, train, val, source.skipped)


def minibatch(train: list[Problem], n: int, seed: int, generation: int) -> list[Problem]:
    """The generation's minibatch: N distinct problems drawn from a stream seeded by (seed, generation).

    ESSA §3.3: every candidate of a generation sees the same prompts; a fresh batch each generation.
    """
    import numpy as np

    rng = np.random.default_rng([seed, generation])
    idx = rng.choice(len(train), size=min(n, len(train)), replace=False)
    return [train[i] for i in idx]
