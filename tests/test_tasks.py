"""Task readers on real rows from ../shared/data and on bad rows (skipped and counted, never a crash)."""
from __future__ import annotations

import json
import re

import pytest
from omegaconf import OmegaConf

from engine.config import ConfigError, TaskConfig
from engine.tasks import arithmetic_problem, default_data_root, load_task

DATA = default_data_root()
needs_data = pytest.mark.skipif(not (DATA / "gsm8k" / "test.jsonl").exists(), reason="../shared/data not present")


def task_cfg(**kw):
    cfg = OmegaConf.structured(TaskConfig)
    for k, v in kw.items():
        cfg[k] = v
    return cfg


@needs_data
def test_gsm8k_real_rows():
    t = load_task(task_cfg(name="gsm8k", reader="gsm8k", path="gsm8k", val_size=20, train_size=50))
    assert len(t.train) == 50 and len(t.val) == 20
    p = t.train[0]
    assert p.answer == "72"  # first GSM8K train row (Natalia's clips)
    assert p.solution.endswith("The final answer is \\boxed{72}.") and "<<" not in p.solution
    assert all(re.fullmatch(r"-?[\d.]+", q.answer) for q in t.val)


@needs_data
def test_svamp_single_split_is_carved_into_train_and_val():
    t = load_task(task_cfg(name="svamp", reader="svamp", path="svamp", train_split="test", val_split="test",
                           val_size=100))
    assert len(t.val) == 100 and len(t.train) == 900
    assert not {p.id for p in t.val} & {p.id for p in t.train}
    assert t.val[0].solution.endswith(f"\\boxed{{{t.val[0].answer}}}.")


@needs_data
def test_math500_reads_latex_answers():
    t = load_task(task_cfg(name="math500", reader="math500", path="math500", train_split="test",
                           val_split="test", val_size=10))
    assert len(t.val) == 10 and all(p.answer for p in t.val)


def test_bad_rows_are_skipped_and_counted(tmp_path):
    rows = [{"question": f"{i}+1?", "answer": f"so {i + 1}\n#### {i + 1}"} for i in range(4)] + [
            {"question": "no answer", "answer": "I do not know"},
            {"question": 5, "answer": "#### 3"},
            {"question": "empty final", "answer": "#### "}]
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n3\n")
    t = load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), train_split="train", val_split="train",
                           val_size=1))
    assert t.skipped == {"train": 4}  # 3 unusable rows + 1 line that is JSON but not an object
    assert len(t.train) == 3 and len(t.val) == 1
    (tmp_path / "x.jsonl").write_text(json.dumps(rows[-1]) + "\n")
    with pytest.raises(ValueError, match="no usable rows"):
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(tmp_path), train_split="x", val_split="x"))


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "#### 2"})
    f = tmp_path / "train.jsonl"
    f.write_text(f"{good}\n\n{good}\n{{not json\n{good}\n")  # the bad line is line 4 (blank line 2 counts)
    with pytest.raises(ValueError) as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), train_split="train", val_split="train",
                           val_size=1))
    msg = str(e.value)
    assert msg.startswith(f"task.path: {f} line 4 is not valid JSON (") and msg.endswith("fix or delete the line")
    assert "\n" not in msg
    f.write_text("\n".join([good, "oops", good, "", "[1,", good]) + "\n")  # lines 2 and 5
    with pytest.raises(ValueError, match=r"task.path: .* has 2 lines that are not valid JSON \(lines 2, 5; "
                                         r"line 2: Expecting value\); fix or delete those lines"):
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), train_split="train", val_split="train",
                           val_size=1))
    from engine.commands.bench import load_questions
    (tmp_path / "b.jsonl").write_text(f"{good}\nx\n")
    with pytest.raises(ValueError, match="bench.data: .* line 2 is not valid JSON"):
        load_questions(str(tmp_path / "b.jsonl"), 1)


def test_missing_path_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="task.path"):
        load_task(task_cfg(name="gsm8k", reader="gsm8k", path=str(tmp_path / "nope")))


def test_generic_jsonl_reader(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps({"q": f"{i}+1?", "a": i + 1}) for i in range(10)))
    t = load_task(task_cfg(name="mine", reader="jsonl", path=str(f), question_field="q", answer_field="a",
                           val_size=3, train_split="train", val_split="train"))
    assert len(t.val) == 3 and len(t.train) == 7 and t.val[0].solution is None


def test_arithmetic_is_deterministic_and_correct():
    import random
    a = arithmetic_problem(random.Random("s"), 3, 20)
    b = arithmetic_problem(random.Random("s"), 3, 20)
    assert a == b
    q, ans, sol = a
    # the worked solution's last equation gives the answer
    last = re.findall(r"= (\d+)\.", sol)[-1]
    assert last == ans and sol.endswith(f"\\boxed{{{ans}}}.")
    t = load_task(task_cfg(name="arithmetic", reader="arithmetic", train_size=30, val_size=5))
    assert len(t.train) == 30 and len(t.val) == 5
    assert t.train[0].id.startswith("arithmetic/train/") and t.val[0].id.startswith("arithmetic/val/")


def test_nonexistent_path_says_it_does_not_exist(tmp_path):
    for path in ("/nonexistent/x.jsonl", str(tmp_path / "nope")):
        with pytest.raises(FileNotFoundError, match="does not exist") as e:
            load_task(task_cfg(name="gsm8k", reader="gsm8k", path=path))
        assert "task.path" in str(e.value) and "no train.jsonl" not in str(e.value) and "\n" not in str(e.value)


def test_non_utf8_jsonl_names_the_file(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b'{"question": "caf\xe9?", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match="UTF-8") as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f)))
    assert "task.path" in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_corrupt_parquet_names_the_file(tmp_path):
    f = tmp_path / "train.parquet"
    f.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match="not a readable Parquet file") as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(tmp_path), train_split="train", val_split="train"))
    assert "task.path" in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_sizes_are_checked(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) for i in range(5)))
    for reader, kw, field in (("gsm8k", {"val_size": 0}, "task.val_size"),
                              ("gsm8k", {"train_size": -1}, "task.train_size"),
                              ("arithmetic", {"val_size": 0}, "task.val_size"),
                              ("gsm8k", {"val_size": 5}, "task.val_size")):  # nothing left to train on
        with pytest.raises(ConfigError, match=field):
            load_task(task_cfg(name="mine", reader=reader, path=str(f), **kw))
    t = load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1, train_size=0))  # 0 = all rows
    assert len(t.train) == 4 and len(t.val) == 1


def test_single_file_with_two_split_names_carves_val_out(tmp_path):
    """One file and train_split != val_split: val rows are held out of train, never shared (duplicates too)."""
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(20)]
    f = tmp_path / "all.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows + rows[:5]))  # 5 questions appear twice
    t = load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), train_split="train", val_split="test", val_size=4))
    train_q, val_q = {p.question for p in t.train}, {p.question for p in t.val}
    assert len(t.val) == 4 and not train_q & val_q
    assert train_q | val_q == {r["question"] for r in rows}


@needs_data
def test_single_real_file_has_no_train_val_overlap():
    t = load_task(task_cfg(name="gsm8k", reader="gsm8k", path=str(DATA / "gsm8k" / "test.jsonl"), val_size=50))
    assert len(t.val) == 50 and len(t.train) == 1319 - 50
    assert not {p.question for p in t.train} & {p.question for p in t.val}


def test_bench_question_loader_names_data(tmp_path):
    from engine.commands.bench import load_questions

    f = tmp_path / "q.jsonl"
    f.write_bytes(b'{"question": "caf\xe9?", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match="bench.data") as e:
        load_questions(str(f), 1)
    assert "UTF-8" in str(e.value) and str(f) in str(e.value)


def test_bench_populations_are_checked():
    from engine.commands.bench_config import validate as check_settings

    base = {"populations": [16, 4], "prompts_per_candidate": 8, "max_tokens": 32, "phases_population": 2}
    assert check_settings(OmegaConf.create(base)) == ([2, 4, 16], 8, 32, 2)
    for bad in ("abc", [], [0], [4, "a"], [2.5], 4):
        with pytest.raises(ValueError, match="bench.populations") as e:
            check_settings(OmegaConf.create({**base, "populations": bad}))
        assert "positive integers" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="bench.max_tokens"):
        check_settings(OmegaConf.create({**base, "max_tokens": 0}))


def test_bench_placebo_needs_two_copies():
    """placebo.enabled with phases_population=1 compared one copy with nothing (NaN figures); refused in one line."""
    from engine.commands.bench_config import validate as check_settings

    base = {"populations": [4], "prompts_per_candidate": 8, "max_tokens": 32, "phases_population": 1,
            "placebo": {"enabled": True, "alone": 0}}
    with pytest.raises(ValueError, match=r"^bench.phases_population=1 with placebo.enabled=true: .*phases_population=16"):
        check_settings(OmegaConf.create(base))
    assert check_settings(OmegaConf.create({**base, "phases_population": 16}))[3] == 16
    assert check_settings(OmegaConf.create({**base, "placebo": {"enabled": False, "alone": 0}}))[3] == 1


def test_directory_or_unreadable_file_names_task_path(tmp_path, monkeypatch):
    """A directory where a split file should be (IsADirectoryError) or an unreadable file (PermissionError):
    one ValueError line naming task.path and the fix, not a traceback (break-it finding)."""
    (tmp_path / "train.jsonl").mkdir()
    with pytest.raises(ValueError, match="is a directory") as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(tmp_path), train_split="train", val_split="train"))
    assert "task.path" in str(e.value) and "\n" not in str(e.value)
    f = tmp_path / "data.jsonl"
    f.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    real = type(f).read_text

    def denied(self, *a, **kw):
        if self == f:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(type(f), "read_text", denied)
    with pytest.raises(ValueError, match="cannot read .*Permission denied") as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f)))
    assert "task.path" in str(e.value) and "permissions" in str(e.value) and "\n" not in str(e.value)


def test_jsonl_with_utf8_bom_is_read(tmp_path):
    """A JSONL file that starts with a UTF-8 byte-order mark (Windows editors) reads like any other."""
    f = tmp_path / "all.jsonl"
    rows = [json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) for i in range(6)]
    f.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode())
    t = load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=2))
    assert len(t.train) + len(t.val) == 6 and not t.skipped


def test_hub_without_network_names_task_hub_id(monkeypatch):
    """task.hub_id with no network (datasets raises ConnectionError after its retries): one line naming
    task.hub_id and the fix (a local task.path)."""
    import datasets

    def offline(*a, **kw):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="task.hub_id='openai/gsm8k'") as e:
        load_task(task_cfg(name="gsm8k", reader="gsm8k", hub_id="openai/gsm8k", hub_config="main"))
    assert "task.path" in str(e.value) and "Couldn't reach" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("reader, rows, expect", [
    # built-in reader, wrong field names: names both sets and the jsonl way out
    ("gsm8k", [{"q": "1+1?", "a": "#### 2"}] * 3,
     r"task\.reader=gsm8k expects fields question, answer \(.*\), found a, q; rename the file's fields to "
     r"question, answer, or use task\.reader=jsonl with task\.question_field=<field> task\.answer_field=<field>$"),
    # the fields are right, the values are not (no '#### N')
    ("gsm8k", [{"question": "1+1?", "answer": "2"}] * 3,
     r"expects fields question, answer \(.*'#### <final answer>'\), found answer, question; the fields are there "
     r"but none of their values is usable; fix the values$"),
    # generic reader: the fix is the field mapping
    ("jsonl", [{"prompt": "1+1?", "target": 2}] * 3,
     r"task\.reader=jsonl expects fields question, answer \(.*\), found prompt, target; set task\.question_field "
     r"and task\.answer_field to the file's field names$"),
    ("svamp", [[1, 2], [3]], r"expects fields Body, Question, Answer .*found no fields \(no row is a JSON object\)"),
])
def test_no_usable_rows_names_file_and_fields(tmp_path, reader, rows, expect):
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError) as e:
        load_task(task_cfg(name="mine", reader=reader, path=str(f), train_split="train", val_split="train",
                           val_size=1))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"task 'mine': no usable rows in {f} ({len(rows)} read): ")
    assert re.search(expect, msg), msg


def test_no_usable_rows_names_the_split_file_that_has_none(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "#### 2"})
    (tmp_path / "train.jsonl").write_text(good + "\n" + good + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({"Question": "1+1?", "Answer": 2}) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"no usable rows in {tmp_path / 'test.jsonl'} (1 read)")):
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(tmp_path), train_split="train", val_split="test"))


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
    """JSON allows U+2028, U+2029, U+0085 and form feeds raw inside strings (json.dumps(ensure_ascii=False)
    writes them so); JSONL lines end at '\\n' only. str.splitlines() cut such rows apart and refused a valid
    file as 'N lines that are not valid JSON' (break-it)."""
    f = tmp_path / "all.jsonl"
    seps = ["\u2028", "\u2029", "\x85", "\x0c", "\x1c", "\x0b"]
    rows = [{"question": f"What is {i} + 1?{seps[i % len(seps)]}Be brief.", "answer": f"#### {i + 1}"} for i in range(8)]
    f.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8")
    t = load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=2))
    assert sorted(p.question for p in t.train + t.val) == sorted(r["question"] for r in rows) and not t.skipped
    f.write_text(json.dumps(rows[0], ensure_ascii=False) + "\n{oops\u2028\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r" line 2 is not valid JSON"):  # line numbers count '\n' only
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1))


def test_a_lone_surrogate_names_the_file_and_line(tmp_path):
    """'\\ud800' is valid JSON but no Unicode text: such a question reached the tokenizer, which failed with
    'TextEncodeInput must be Union[...]' in the middle of a run (break-it). An escaped pair (an emoji) is fine."""
    f = tmp_path / "all.jsonl"
    good = [json.dumps({"question": f"{i} + 1 = ? \U0001F600", "answer": f"#### {i + 1}"}) for i in range(4)]
    f.write_text("\n".join(good) + "\n")
    assert len(load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1)).train) == 3
    f.write_text("\n".join(good[:2] + ['{"question": "bad \\ud800 here", "answer": "#### 1"}'] + good[2:]) + "\n")
    with pytest.raises(ValueError) as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1))
    msg = str(e.value)
    assert msg.startswith(f"task.path: {f} line 3 holds a lone surrogate") and "fix or delete the line" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("reader, row", [
    ("gsm8k", {"question": "  ", "answer": "#### 2"}),
    ("math500", {"problem": "", "answer": "2"}),
    ("jsonl", {"question": " \n", "answer": 2}),
    ("svamp", {"Body": " ", "Question": "", "Answer": 2}),
])
def test_a_row_with_an_empty_question_is_skipped(tmp_path, reader, row):
    """An empty question is no usable row: it was kept, and a file of them ended in 'no usable rows (train 0,
    val 5, skipped {'train (question also in val)': 15})', blaming duplicates (break-it)."""
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(row) for _ in range(6)) + "\n")
    with pytest.raises(ValueError, match=r"the fields are there but none of their values is usable"):
        load_task(task_cfg(name="mine", reader=reader, path=str(f), train_split="train", val_split="train",
                           val_size=1))


def test_a_json_file_holding_one_object_says_so(tmp_path):
    """A pretty-printed .json object is not rows: it was refused as '4 lines that are not valid JSON (...);
    fix or delete those lines', which no line edit fixes (break-it)."""
    f = tmp_path / "data.json"
    f.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}, indent=2))
    with pytest.raises(ValueError) as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1))
    msg = str(e.value)
    assert msg.startswith(f"task.path: {f} holds one JSON object, not rows") and "JSON array" in msg and "JSONL" in msg
    f.write_text(json.dumps([{"question": f"{i}+1?", "answer": f"#### {i + 1}"} for i in range(3)], indent=2))
    assert len(load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=1)).train) == 2


def test_train_emptied_by_duplicates_of_held_out_questions_says_so(tmp_path):
    """Every train row repeated a held-out question: 'no usable rows (train 0, val 2, skipped {...}); check task.path
    and the field names' named neither the file nor the cause (the fields were fine; break-it)."""
    f = tmp_path / "dup.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"q{i % 2}?", "answer": f"#### {i}"}) for i in range(8)) + "\n")
    with pytest.raises(ValueError) as e:
        load_task(task_cfg(name="mine", reader="gsm8k", path=str(f), val_size=2))
    msg = str(e.value)
    assert msg.startswith(f"task 'mine': every train row of {f} repeats a held-out question (6 rows;") and "\n" not in msg
    assert "deduplicate" in msg
