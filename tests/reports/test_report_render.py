"""The HTML report rendered by a real browser (headless Chromium, when installed): it must draw."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from modelopt.reports import write_report

pytestmark = pytest.mark.slow  # reads the session fixture small_run (a finished MCTS run, ~35 s) and drives chromium

CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
def test_report_html_renders_in_headless_chromium(tmp_path, small_run):
    import numpy as np
    from PIL import Image

    run = tmp_path / "run"
    shutil.copytree(small_run, run, ignore=shutil.ignore_patterns("strategy_state.json", "report*"))
    page = write_report(run).html
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,3000",
           page.resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 3000)
    px = np.asarray(img.resize((300, 750))).reshape(-1, 3).astype(int)
    non_white = int((px.min(axis=1) < 235).sum())
    assert non_white > 0.05 * len(px)  # text, tables and plots, not a blank page
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    # The plots drew: the Pareto plot's blue trial dots and the layer map's red/orange cells are there.
    assert int(((b > 150) & (r < 110)).sum()) > 50
    assert int(((r > 200) & (g < 140) & (b < 90)).sum()) > 50


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
def test_a_curve_runs_report_draws_its_certified_curve_in_headless_chromium(tmp_path, small_curve_run):
    import numpy as np
    from PIL import Image

    run = tmp_path / "run"
    shutil.copytree(small_curve_run, run, ignore=shutil.ignore_patterns("report*"))
    paths = write_report(run)
    curve = next(p for p in paths.images if "curve" in p.name)  # the figure the HTML embeds
    html = paths.html.read_text()
    assert "Certified curve" in html
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1300",
           paths.html.resolve().as_uri()]  # the top of the page: the summary, then the curve, before the Pareto plot
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    page = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    figure = np.asarray(Image.open(curve).convert("RGB")).astype(int)

    def stars(px: np.ndarray) -> int:  # the certified points' gold stars (#f2b705)
        r, g, b = px[..., 0], px[..., 1], px[..., 2]
        return int(((r > 215) & (g > 160) & (g < 205) & (b < 60)).sum())

    assert stars(figure) > 30  # the figure drew its points
    assert stars(page) > 30  # and the browser drew it on the page, above the Pareto plot (whose star is below)
