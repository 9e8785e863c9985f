"""The commit a record names: from git, or from a `git archive` copy's filled placeholder."""
import subprocess
import tarfile
from pathlib import Path

import pytest

from dlscale.results import envinfo

ROOT = Path(__file__).resolve().parent.parent


def test_archive_sha_filled_and_unfilled(tmp_path):
    f = tmp_path / "ARCHIVE_SHA"
    f.write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert envinfo.archive_sha(f) == "0123456789abcdef0123456789abcdef01234567"
    f.write_text("$Format:%H$\n")  # a copy made without git archive
    assert envinfo.archive_sha(f) is None
    assert envinfo.archive_sha(tmp_path / "missing") is None


def test_git_archive_fills_the_placeholder(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("git unavailable")
    tar = tmp_path / "a.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(tar), "HEAD", "dlscale/ARCHIVE_SHA"], check=True)
    with tarfile.open(tar) as t:
        t.extractall(tmp_path, filter="data")
    assert envinfo.archive_sha(tmp_path / "dlscale" / "ARCHIVE_SHA") == head.stdout.strip()
