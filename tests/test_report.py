"""engine/results/report.py on the recorded run directory tests/fixtures/run_small (make_run_small.py)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.results.report import build_figures, cli, legend_texts, load_run, make_report

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run_small"
# Expectations are read from the fixture's own files, so a recorded real run can replace it.
LABEL = json.loads((FIXTURE / "run.json").read_text())["label"]
VAL = pq.read_table(FIXTURE / "validation.parquet").to_pylist()
EVAL = FIXTURE / "eval" / "eval_summary.json"
EVAL_CONDS = list(json.loads(EVAL.read_text())["conditions"]) if EVAL.exists() else []
ALL = {"fitness", "sigma", "val_accuracy_generation", "val_accuracy_wallclock", "throughput"} | (
    {"passk"} if EVAL_CONDS else set())

# figure -> (title, x label, y label)
AXES = {
    "fitness": ("Fitness per generation", "generation", "fitness (mean reward on the minibatch)"),
    "sigma": ("Strategy step size", "generation", "step size sigma (genome units)"),
    "val_accuracy_generation": ("Held-out accuracy per generation", "generation (ES) / training step (GRPO)",
                                "held-out accuracy (greedy)"),
    "val_accuracy_wallclock": ("Held-out accuracy against wall-clock time", "wall-clock time (s)",
                               "held-out accuracy (greedy)"),
    "passk": ("pass@k (unbiased estimator)", "k (samples per problem)", "pass@k"),
    "throughput": ("Generation throughput", "generation", "tokens / s (population generate)"),
}


def _grpo_run(tmp_path: Path) -> Path:
    """A baseline run as essa grpo writes it: validation.parquet, and metrics.parquet keyed by optimiser step."""
    d = tmp_path / "grpo_run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"method": "f-grpo", "label": "f-grpo gamma=0.5", "task": "arithmetic"}))
    rows = [{"step": s, "wall_s": 60.0 + 40 * s, "condition": "mean", "accuracy": 0.3 + 0.01 * s,
             "n_problems": 32, "method": "f-grpo"} for s in range(0, 7, 2)]
    pq.write_table(pa.Table.from_pylist(rows), d / "validation.parquet")
    steps = [{"step": s, "wall_s": 50.0 + 40 * s, "reward_mean": 0.1, "loss": 0.01} for s in range(1, 7)]
    pq.write_table(pa.Table.from_pylist(steps), d / "metrics.parquet")
    return d


def test_figures_have_expected_axes():
    figs = build_figures([load_run(FIXTURE)])
    assert set(figs) == ALL
    for name, (title, xlabel, ylabel) in AXES.items():
        if name not in ALL:
            continue
        ax = figs[name].axes[0]
        assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (title, xlabel, ylabel), name
        assert ax.lines, f"{name} has no lines"
    fit = figs["fitness"].axes[0]
    assert [l.get_label() for l in fit.lines] == [f"{LABEL}: mean", f"{LABEL}: best so far"]
    assert fit.collections, "fitness min-max band missing"
    # the mean curve starts at the SFT point of step 0: steps 0, 2, 4, 6
    val = {l.get_label(): l for l in figs["val_accuracy_generation"].axes[0].lines}
    mean_steps = [r["step"] for r in VAL if r["condition"] == "mean"]
    assert list(val[f"{LABEL}: mean"].get_xdata()) == [0] + mean_steps
    if EVAL_CONDS:
        assert figs["passk"].axes[0].get_xscale() == "log"
        assert len(figs["passk"].axes[0].lines) == len(EVAL_CONDS)     # one curve per condition


def test_make_report_writes_decodable_pngs_and_markdown(tmp_path):
    import matplotlib.image as mpimg

    paths = make_report([FIXTURE], tmp_path / "report")
    names = {p.stem for p in paths if p.suffix == ".png"}
    assert names == ALL
    for p in paths:
        assert p.stat().st_size > 1024, p
        if p.suffix == ".png":
            img = mpimg.imread(p)
            assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    md = (tmp_path / "report" / "report.md").read_text()
    latest = {r["condition"]: r["accuracy"] for r in sorted(VAL, key=lambda r: r["step"])}
    cells = " | ".join(f"{latest[c]:.3f}" for c in ("no_adapter", "sft", "mean", "best") if c in latest)
    assert f"| {LABEL} | {cells} | {VAL[0]['n_problems']} | {max(r['step'] for r in VAL)} |" in md
    assert "![Fitness per generation](fitness.png)" in md
    assert ("pass@" in md) == bool(EVAL_CONDS)
    assert not any(tmp_path.joinpath("report").glob(".*tmp*"))


def test_several_runs_overlaid_and_missing_data_skipped(tmp_path):
    grpo = _grpo_run(tmp_path)
    figs = build_figures([load_run(FIXTURE), load_run(grpo)])
    legend = [" ".join(t.split()) for t in legend_texts(figs["val_accuracy_wallclock"])]
    assert "f-grpo gamma=0.5: mean" in legend and " ".join(f"{LABEL}: mean".split()) in legend
    # the GRPO run's metrics are per step, without fitness: only the ES run is in the fitness figure
    assert all("f-grpo" not in l.get_label() for l in figs["fitness"].axes[0].lines)

    paths = make_report([grpo], tmp_path / "only_grpo")
    assert {p.name for p in paths} == {"val_accuracy_generation.png", "val_accuracy_wallclock.png", "report.md"}
    md = (tmp_path / "only_grpo" / "report.md").read_text()
    assert "Not drawn:" in md and "`fitness.png` (no fitness_mean in metrics.parquet (an ES run's))" in md


def test_eval_only_directory_is_a_run(tmp_path):
    if not EVAL_CONDS:
        pytest.skip("fixture has no eval/eval_summary.json")
    d = tmp_path / "eval_out"
    shutil.copytree(FIXTURE / "eval", d)
    run = load_run(d)
    assert run.label == json.loads(EVAL.read_text())["label"] and len(run.evals) == 1
    paths = make_report([d], tmp_path / "r")
    assert {p.name for p in paths} == {"passk.png", "report.md"}


def test_cli_default_out_and_bad_path(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    assert cli([str(run)]) is None                        # the console script exits with main's return
    printed = capsys.readouterr().out.split()
    assert len(printed) == len(ALL) + 1 and all(Path(p).parent == run / "report" and Path(p).exists() for p in printed)
    with pytest.raises(SystemExit) as e:
        cli([str(run), str(tmp_path / "nope")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("essa: error:") and f"{tmp_path / 'nope'} does not exist" in err and "\n" not in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        cli([str(tmp_path / "empty")])
    assert e.value.code == 2 and "is not a run directory" in capsys.readouterr().err


def test_cli_nonexistent_path_says_so(capsys):
    """essa report /nonexistent: the path does not exist (was: 'is not a run directory (no run.json ...)')."""
    with pytest.raises(SystemExit) as e:
        cli(["/nonexistent"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("essa: error: /nonexistent does not exist;") and "\n" not in err, err


def test_essa_report_command(tmp_path):
    """Through the real console script, several runs -> --out."""
    exe = Path(sys.executable).parent / "essa"
    if not exe.exists():
        pytest.skip("essa console script not installed in this environment")
    out = tmp_path / "cmp"
    res = subprocess.run([str(exe), "report", str(FIXTURE), str(_grpo_run(tmp_path)), "--out", str(out)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (out / "val_accuracy_wallclock.png").stat().st_size > 1024
    assert (out / "report.md").exists()


def test_corrupt_run_files_name_the_file(tmp_path, capsys):
    for name, content in (("run.json", b"{label: oops"), ("eval/eval_summary.json", b"{\n"),
                          ("metrics.parquet", b"not parquet"), ("validation.parquet", b"PAR1 truncated")):
        run = tmp_path / name.replace("/", "_")
        shutil.copytree(FIXTURE, run)
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).write_bytes(content)
        with pytest.raises(ValueError) as e:
            load_run(run)
        assert str(run / name) in str(e.value) and "\n" not in str(e.value), name
        with pytest.raises(SystemExit) as ex:
            cli([str(run), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err.strip()
        assert ex.value.code == 2 and err.startswith("essa: error:") and str(run / name) in err and "\n" not in err


@pytest.mark.parametrize("name, column", [("validation.parquet", "condition"), ("validation.parquet", "step"),
                                          ("metrics.parquet", "generation")])
def test_rows_without_a_key_column_name_the_file(tmp_path, capsys, name, column):
    """A validation.parquet without `condition` was a bare KeyError "'condition'"; a None `step` or `generation`
    a TypeError traceback from the sort (exit 1). Both are one line naming the file and column now (exit 2)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    table = pq.read_table(run / name)
    i = table.column_names.index(column)
    nulls = pa.nulls(table.num_rows, type=table.schema.field(column).type)
    pq.write_table(table.set_column(i, column, nulls) if column != "condition" else table.drop([column]), run / name)
    with pytest.raises(SystemExit) as ex:
        cli([str(run), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert ex.value.code == 2 and str(run / name) in err and f"'{column}'" in err
    assert "\n" not in err and "leave this run out" in err


def test_cli_unwritable_out_names_the_argument(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for out in ("/proc/nope", str(blocker / "sub")):
        with pytest.raises(SystemExit) as e:
            cli([str(FIXTURE), "--out", out])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith(f"essa: error: --out {out}:") and "\n" not in err


def test_paired_gain_draws_each_runs_difference_with_its_interval(tmp_path):
    """paired_gain.png (issue 11): one error bar per run and condition of summary.json's paired_vs_sft,
    centred on the difference, spanning its 95 % interval; skipped when no run has it."""
    run = tmp_path / "es_run"
    shutil.copytree(FIXTURE, run)
    paired = {"mean": {"diff": 0.04, "ci_low": 0.01, "ci_high": 0.07, "b": 40, "c": 20, "n": 500, "p_value": 0.013},
              "best": {"diff": -0.01, "ci_low": -0.04, "ci_high": 0.02, "b": 20, "c": 25, "n": 500, "p_value": 0.55}}
    (run / "summary.json").write_text(json.dumps({"val": {}, "paired_vs_sft": paired}))
    fig = build_figures([load_run(run), load_run(FIXTURE)])["paired_gain"]
    ax = fig.axes[0]
    centres = [tuple(line.get_xydata()[0]) for line in ax.lines if line.get_marker() in ("o", "*")]  # not the caps
    assert centres == [(0.04, 1.0), (-0.01, 0.0)]          # mean on top, then best; the fixture has no summary
    spans = sorted(tuple(np.round(seg[:, 0], 6)) for coll in ax.collections for seg in coll.get_segments())
    assert spans == [(-0.04, 0.02), (0.01, 0.07)]
    legend = [" ".join(t.split()) for t in legend_texts(fig)]
    assert [t.split(": ")[-1] for t in legend] == ["mean (p 0.013, n 500)", "best (p 0.55, n 500)"]
    assert "paired_gain" not in build_figures([load_run(FIXTURE)])


def test_cli_exits_1_naming_a_failed_figure_and_writes_the_rest(tmp_path, capsys, monkeypatch):
    """A figure whose builder raises: the other figures and report.md are written, report.md says
    which failed and why, and `essa report` exits 1 with one line (it used to exit 0)."""
    import engine.results.report as report

    def broken(runs, labels, colors):
        raise ValueError("x and y differ\nsecond line")

    monkeypatch.setitem(report.FIGURE_BUILDERS, "sigma", broken)
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "report").mkdir()
    (run / "report" / "throughput.png").mkdir()        # saving this one fails: the same path, not a traceback
    with pytest.raises(SystemExit) as e:
        cli([str(run)])
    assert e.value.code == 1
    out, err = capsys.readouterr()
    assert err.strip().startswith("essa: error: 2 figure(s) failed") and "sigma.png" in err and "\n" not in err.strip()
    written = [Path(p) for p in out.split()]
    assert len(written) == len(ALL) - 1 and all(p.exists() for p in written) and not (run / "report" / "sigma.png").exists()
    assert "`sigma.png` (error: ValueError: x and y differ)" in (run / "report" / "report.md").read_text()
    assert not list((run / "report").glob(".*tmp*"))
    assert make_report([run], tmp_path / "lenient")[-1].name == "report.md"   # train's end-of-run report stays lenient


def _passk_study(tmp_path: Path) -> Path:
    """An essa eval directory of the pass@k study (issue 44): three conditions, the control ``sft``, each
    condition's bootstrap interval and its paired difference against the control."""
    d = tmp_path / "study"
    d.mkdir()
    ks = ["1", "2", "4", "8"]
    pk = {"sft": [0.30, 0.42, 0.55, 0.66], "essa": [0.34, 0.46, 0.58, 0.68], "grpo": [0.33, 0.44, 0.55, 0.64]}
    conds = {c: {"greedy_accuracy": v[0], "avg_at_n": v[0], "n_problems": 50, "pass_at_k": dict(zip(ks, v)),
                 "pass_at_k_ci95": {k: [x - 0.05, x + 0.05] for k, x in zip(ks, v)}} for c, v in pk.items()}
    for c in ("essa", "grpo"):
        conds[c]["pass_at_k_vs_control"] = {k: {"diff": x - y, "low": x - y - 0.02, "high": x - y + 0.02, "problems": 50}
                                            for k, x, y in zip(ks, pk[c], pk["sft"])}
    pairs = [{"condition": "essa", "against": "grpo",
              "pass_at_k": {k: {"diff": x - y, "low": x - y - 0.03, "high": x - y + 0.03, "problems": 50}
                            for k, x, y in zip(ks, pk["essa"], pk["grpo"])}}]
    (d / "eval_summary.json").write_text(json.dumps({"label": "study", "task": "arithmetic", "split": "val", "n": 8,
                                                     "temperature": 1.0, "ks": [1, 2, 4, 8], "control": "sft",
                                                     "conditions": conds, "pass_at_k_pairs": pairs}))
    return d


def test_passk_figures_draw_intervals_and_the_difference_against_the_control(tmp_path):
    """passk.png shades each condition's bootstrap interval; passk_diff.png draws each condition minus the
    control with its paired interval and a zero line; both are written as PNGs, report.md has the table."""
    from matplotlib.collections import PolyCollection

    figs = build_figures([load_run(_passk_study(tmp_path))])
    ax = figs["passk"].axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(ax.lines) == 3 and len(bands) == 3
    lows = sorted(round(float(v[1]), 6) for b in bands for v in b.get_paths()[0].vertices if v[0] == 1)
    assert {0.25, 0.29, 0.28} <= set(lows)                           # each band starts at its pass@1 - 0.05
    assert len({l.get_color() for l in ax.lines}) == 3                # one eval: a colour per condition
    assert len({l.get_marker() for l in ax.lines}) == 3               # and a marker, kept when runs are overlaid
    diff = figs["passk_diff"].axes[0]
    assert (diff.get_title(), diff.get_xlabel(), diff.get_xscale()) == (
        "pass@k difference against the control (paired bootstrap 95 % interval)", "k (samples per problem)", "log")
    curves = {l.get_label().split(" (")[0]: l for l in diff.lines if l.get_label() and not l.get_label().startswith("_")}
    assert set(curves) == {"study: essa - sft", "study: grpo - sft"}
    np.testing.assert_allclose(curves["study: essa - sft"].get_ydata(), [0.04, 0.04, 0.03, 0.02], atol=1e-12)
    assert any(list(l.get_ydata()) == [0.0, 0.0] for l in diff.lines)   # the zero line
    assert len([c for c in diff.collections if isinstance(c, PolyCollection)]) == 2
    colour = {l.get_label().split(" (")[0]: l.get_color() for l in ax.lines}
    assert curves["study: essa - sft"].get_color() == colour["study: essa"]  # a condition keeps its colour

    paths = make_report([tmp_path / "study"], tmp_path / "r")
    assert {p.name for p in paths} == {"passk.png", "passk_diff.png", "report.md"}
    for p in paths[:-1]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1024
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| study | [study](../study) | 1.0 | 8 | essa | sft | +0.040 [+0.020, +0.060] |" in md
    assert "| essa | grpo | +0.010 [-0.020, +0.040] | +0.020 [-0.010, +0.050] | +0.030 [+0.000, +0.060] |" in md
    assert "-0.000" not in md                                        # -1e-17 prints +0.000
    assert "![pass@k difference against the control (paired bootstrap 95 % interval)](passk_diff.png)" in md
    assert "passk_diff" not in build_figures([load_run(FIXTURE)])    # summaries without it: not drawn
    assert "`passk_diff.png` (no eval_summary.json with pass_at_k_vs_control" in \
        (make_report([FIXTURE], tmp_path / "old")[-1]).read_text()


def _eval_dir(tmp_path: Path, summary: dict) -> Path:
    d = tmp_path / "ev"
    d.mkdir(parents=True, exist_ok=True)
    (d / "eval_summary.json").write_text(json.dumps(summary))
    return d


def test_old_one_condition_and_open_interval_summaries_report(tmp_path):
    """Summaries without today's fields (control, pass_at_k_ci95, vs_control, pairs), with one condition, or
    with None intervals and differences (an empty problem set) draw and write report.md without an error."""
    conds = {"no_adapter": {"greedy_accuracy": 0.5, "avg_at_n": 0.4, "pass_at_k": {"1": 0.4, "2": 0.5},
                            "n_problems": 3}}
    for i, summary in enumerate([
            {"n": 2, "temperature": 1.0, "conditions": conds},                                     # old
            {"n": 2, "temperature": 1.0, "control": "no_adapter", "pass_at_k_pairs": [],
             "conditions": {"no_adapter": {**conds["no_adapter"], "pass_at_k_ci95": {"1": None, "2": [0.3, 0.6]}}}},
            {"n": 2, "temperature": 1.0, "control": "a", "pass_at_k_pairs": None, "conditions": {
                "a": {"pass_at_k": {"1": None, "2": None}, "pass_at_k_ci95": None, "n_problems": 3},
                "b": {"pass_at_k": {"1": 0.4, "2": 0.5}, "n_problems": 3, "pass_at_k_vs_control": {
                    "1": {"diff": None, "low": None, "high": None, "problems": 0}}}}}]):
        paths = make_report([_eval_dir(tmp_path / str(i), summary)], tmp_path / f"r{i}", strict=True)
        assert paths[-1].name == "report.md" and "passk.png" in {p.name for p in paths}
        assert not list((tmp_path / f"r{i}").glob(".*.tmp"))                       # written atomically


@pytest.mark.parametrize("summary, where", [
    ({"n": 2, "conditions": None}, "'conditions' must be an object"),
    ({"n": 2, "conditions": {"a": None}}, "conditions.a must be an object"),
    ({"n": 2, "conditions": {"a": {"pass_at_k": {"one": 0.5}}}}, "conditions.a.pass_at_k has key 'one'"),
    ({"n": 2, "conditions": {"a": {"pass_at_k": {"1": 0.5}, "pass_at_k_ci95": [0.1, 0.2]}}},
     "conditions.a.pass_at_k_ci95 must be an object"),
    ({"n": 2, "control": "a", "conditions": {"a": {"pass_at_k": {"1": 0.5}},
                                             "b": {"pass_at_k_vs_control": {"x": {"diff": 0.1}}}}},
     "conditions.b.pass_at_k_vs_control has key 'x'"),
    ({"n": 2, "conditions": {}, "pass_at_k_pairs": ["junk"]}, "pass_at_k_pairs[0] must be an object"),
    ({"n": 2, "conditions": {"a": {"pass_at_k": {"1": "0.5"}}}}, "conditions.a.pass_at_k.1 must be a number or null"),
])
def test_a_malformed_eval_summary_names_the_file_and_field(tmp_path, capsys, summary, where):
    """A hand-edited or truncated-by-a-tool eval_summary.json was an AttributeError traceback (conditions null, a
    condition null) or a bare "invalid literal for int()" (a k that is no integer); now one line naming the file
    and the field, exit 2, like any corrupt run file."""
    d = _eval_dir(tmp_path, summary)
    with pytest.raises(SystemExit) as ex:
        cli([str(d), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert ex.value.code == 2 and err.startswith(f"essa: error: {d / 'eval_summary.json'}: {where}"), err
    assert "\n" not in err and "leave this run out" in err


def test_grpo_run_without_its_method_names_run_json(tmp_path):
    """A GRPO run whose run.json lost its method: the one-line error says what the report read and why."""
    d = _grpo_run(tmp_path)
    (d / "run.json").write_text(json.dumps({"label": "f-grpo gamma=0.5", "task": "arithmetic"}))
    with pytest.raises(ValueError, match=r"metrics.parquet has rows without a 'generation' \(run.json says method "
                                         r"'-'.*method grpo or f-grpo"):
        load_run(d)


def test_run_links_with_spaces_stay_links(tmp_path):
    spaced = tmp_path / "grpo run"
    _grpo_run(tmp_path).rename(spaced)
    make_report([spaced], tmp_path / "out")
    assert "[grpo run](<../grpo run>)" in (tmp_path / "out" / "report.md").read_text()
