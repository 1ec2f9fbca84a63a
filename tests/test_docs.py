"""The documentation site builds, and its strict build fails on a broken link, anchor or page.

`mkdocs build --strict` (mkdocs.yml; .ci/run runs it too) turns every warning into a failure. These
tests build a copy of the docs in a temporary directory: the real tree must build, and one broken
internal link, one broken anchor or one page left out of the nav must each make the build fail with
a line naming it. About 3 s per build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_site(tmp_path: Path) -> Path:
    """The site's sources (mkdocs.yml, docs/, and strategies/ for the API reference) under tmp_path."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "strategies", tmp_path / "strategies", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _build(site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site / "mkdocs.yml"),
                           "-d", str(site / "site")], cwd=site, env=env, capture_output=True, text=True, timeout=300)


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}: pick another link to break"
    path.write_text(text.replace(old, new, 1))


def test_real_docs_build_strict(tmp_path):
    res = _build(_copy_site(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "strategies" / "index.html").read_text()
    for name in ("strategies.base.Strategy.ask", "strategies.base.Strategy.tell", "strategies.genomes.SVDLoRAGenome",
                 "strategies.testing.check_strategy"):
        assert f'id="{name}"' in api, f"the API reference lacks {name}"


@pytest.mark.parametrize("breakage, expected", [
    # a link to a page that does not exist
    (("index.md", "(guide/install.md)", "(guide/no-such-page.md)"), "guide/no-such-page.md"),
    # a link to an anchor the target page does not have
    (("results/speed.md", "../log/2026-12-02-real-runs-of-the-levers.md#no-amx",
      "../log/2026-12-02-real-runs-of-the-levers.md#no-such-anchor"), "no-such-anchor"),
])
def test_strict_build_fails_on_a_broken_link(tmp_path, breakage, expected):
    site = _copy_site(tmp_path)
    page, old, new = breakage
    _replace(site / "docs" / page, old, new)
    res = _build(site)
    assert res.returncode != 0, "the strict build passed with a broken link"
    assert expected in res.stderr, res.stderr[-3000:]


def test_strict_build_fails_on_a_page_left_out_of_the_nav(tmp_path):
    site = _copy_site(tmp_path)
    (site / "docs" / "guide" / "orphan.md").write_text("# A page nobody can reach\n")
    res = _build(site)
    assert res.returncode != 0, "the strict build passed with a page missing from the nav"
    assert "orphan.md" in res.stderr, res.stderr[-3000:]


def test_readme_links_resolve():
    """The README is read on GitHub, outside the site: its relative links must name files that exist."""
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert any(t.startswith("docs/results/") for t in targets), "the README links no results page"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"
