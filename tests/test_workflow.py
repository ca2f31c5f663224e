"""The real Snakefile end to end on the smoke config: every table and figure exists and is finite."""

import html as html_module
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from margrpo.experiment.config import load_config, shared_dirs

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake(workdir, *args, configfile=REPO / "config/smoke.yaml"):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    cmd = [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(configfile),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


SMOKE_OUTPUTS = ("results", "logs", "timings", ".snakemake")  # what a run leaves in its working directory


def finished_smoke_run() -> bool:
    """Whether this checkout holds a smoke run (`make run SNAKEMAKE_ARGS="--configfile config/smoke.yaml"`, as CI
    runs before the tests) that is up to date: Snakemake finds nothing to do for it."""
    if not (REPO / "results/smoke/report").is_dir():
        return False
    out = subprocess.run(
        [
            SNAKEMAKE,
            "-n",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(REPO),
            "--configfile",
            str(REPO / "config/smoke.yaml"),
            "--cores",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    return out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """A finished smoke DAG in a working directory of its own: a copy of the checkout's smoke run when it is up to
    date (the same Snakefile and config made it; the copy keeps its files' times, so Snakemake sees it finished),
    else a run of its own. Tests change their copy, never the checkout."""
    workdir = tmp_path_factory.mktemp("smoke")
    if finished_smoke_run():
        for name in SMOKE_OUTPUTS:
            if (REPO / name).exists():
                shutil.copytree(
                    REPO / name,
                    workdir / name,
                    symlinks=True,
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"),
                )
        return workdir
    out = snakemake(workdir)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-6000:]
    return workdir


@pytest.mark.slow
def test_smoke_dag_writes_every_table_and_figure(smoke_run):
    report = smoke_run / "results/smoke/report"
    for table in ("table1", "table2"):
        for ext in ("csv", "md", "tex"):
            assert (report / f"{table}.{ext}").stat().st_size > 0
        df = pd.read_csv(report / f"{table}.csv")
        means = df[[c for c in df.columns if c.endswith("/mean") and not c.startswith("lift/")]]  # lift: below
        assert len(means.columns) and means.notna().all().all()
        assert all(math.isfinite(v) for v in means.to_numpy().ravel())
        for scorer in (
            "toypref",
            "toyclip",
            "backdrop",
        ):  # Table 1's preference metrics: the scorer, alignment, the exact aesthetic
            assert any(f"/{scorer}/mean" in c for c in means.columns), (table, list(means.columns))
    gain = pd.read_csv(report / "val_gain.csv")  # the Base row holds the base reward, the others their gains
    assert math.isfinite(gain.loc[gain["variant"] == "base", "val/base/mean"].iloc[0])
    trained = gain[gain["variant"] != "base"]
    assert (
        len(trained)
        and np.isfinite(
            trained[[c for c in gain.columns if c.startswith("gain/") and c.endswith("/mean")]].to_numpy()
        ).all()
    )
    # the climbing ladder: each rung's lift over the shuffled control in Table 2, val_gain and claim k, and its figure
    table2 = pd.read_csv(report / "table2.csv")
    climb = table2[(table2["policy"] == "toy-micro") & ~table2["variant"].isin(["base", "control"])]
    assert len(climb) and np.isfinite(climb["lift/redness - control/mean"]).all()
    assert table2.loc[table2["policy"] == "toy-nova", "lift/redness - control/mean"].isna().all()
    assert np.isfinite(gain.loc[gain["policy"] == "toy-micro", "lift/last step - control/mean"].dropna()).all()
    claims = pd.read_csv(report / "claims.csv")
    k = claims[claims["claim"] == "k"]
    assert set(k["comparison"]) == {"GRPO* - shuffled control", "+Fix* - shuffled control"}, k["comparison"].tolist()
    assert (k["block"] == "toy-micro / redness").all() and k["diff"].map(math.isfinite).all()
    for fig in (
        "fig_climb",
        "fig2_dynamics",
        "fig4_uncertainty",
        "fig6_samples",
        "fig7a_samples",
        "fig7b_reward_curves",
        "fig7c_final_metric",
    ):
        for ext in ("png", "pdf"):
            assert (report / f"{fig}.{ext}").stat().st_size > 1000


def test_smoke_dag_measures_each_estimator_against_the_exact_gradient(smoke_run):
    """Issue 62: the estimators' stage in the smoke DAG: one row per estimator with finite noise and cost, the exact
    gradient's record, claims h-j in the claims table, the figure."""
    report = smoke_run / "results/smoke/report"
    rows = pd.read_csv(report / "estimators.csv")
    assert list(rows["estimator"]) == ["fix", "mte", "sim", "committed", "every_step", "pathwise"]
    assert (rows["batches"] == 3).all() and (rows["noise_trcov"] > 0).all() and (rows["cpu_s_per_batch"] > 0).all()
    assert np.isfinite(rows[["proj_mean", "cos_mean_exact", "snr_per_batch", "signal_per_cpu_s"]].to_numpy()).all()
    exact = json.loads((smoke_run / "results/smoke/estimators/toy-nova/toypref/exact.json").read_text())
    assert exact["images"] == 8 and -1 <= exact["half_cos"] <= 1 and exact["norm"] > 0
    claims = pd.read_csv(report / "claims.csv")
    assert sorted(claims.loc[claims["claim"].isin(["h", "i", "j"]), "claim"]) == ["h", "i", "i", "j", "j", "j"]
    assert "measured at the base policy" in (report / "claims.md").read_text()
    assert (report / "fig_estimators.png").stat().st_size > 1000


def test_smoke_dag_measures_the_ar_gradient_at_trained_checkpoints(smoke_run):
    """Issue 71 item 1: rule checkpoint_gradient at each ladder seed's checkpoint of GRPO and +Fix (the checkpoint's
    own policy folder, where the run keeps it), its report and figure, and claim b's two trained-checkpoint rows."""
    from margrpo.grpo.run_files import checkpoint_path

    report = smoke_run / "results/smoke/report"
    points = pd.read_csv(report / "checkpoint_gradients.csv")
    assert sorted(set(zip(points["variant"], points["seed"], points["step"]))) == sorted(
        (v, s, t) for v in ("fix", "grpo") for s in (0, 1) for t in (0, 2)
    )
    assert (points["batches"] == 3).all() and (points["norm"] > 0).all()
    at_base = points[points["step"] == 0]
    assert at_base["norm"].nunique() == 1  # the base's +Fix batches, shared
    log = (smoke_run / "logs/smoke/estimators/toy-nova/toypref/checkpoints/grpo-seed1-step2.log").read_text()
    run = smoke_run / "results/smoke/train/toy-nova/toypref/grpo/seed1"
    assert checkpoint_path(run / "state", 2).is_dir()
    claims = pd.read_csv(report / "claims.csv")
    trained = claims[claims["statement"].str.contains("at trained checkpoints")]
    assert list(trained["claim"]) == ["b", "b"] and (trained["comparison"] == "+Fix / GRPO").all()
    assert (report / "fig_checkpoint_gradients.png").stat().st_size > 1000
    assert "batch 3/3" in log


def test_every_stage_of_the_smoke_dag_records_the_kernel_caps_it_ran_under(smoke_run):
    """Issue #37: the caps reach every stage through `margrpo` itself (not through the Makefile), and each stage's
    spec.json says which kernels made its result."""
    from margrpo.infra.kernels import CAPS

    expected = {k: os.environ.get(k, v) for k, v in CAPS.items()}  # a cap the caller set stands
    specs = sorted((smoke_run / "results").rglob("spec.json"))
    stages = {p.relative_to(smoke_run / "results").parts[0] for p in specs}
    assert {"data", "toyclip", "toypref", "pretrain", "smoke"} <= stages, (
        stages
    )  # shared stages and this config's runs
    for path in specs:
        kernels = json.loads(path.read_text())["kernels"]
        assert {k: kernels[k] for k in CAPS} == expected, path
        assert kernels["torch_cpu_capability"] != "AVX512" and kernels["cpu"], path


@pytest.mark.slow
def test_smoke_dag_writes_the_claims_table(smoke_run):
    """Every claim the smoke ladder can test has its row, with a finite effect and interval (two seeds: the
    bootstrap decides), and every paired difference is finite."""
    report = smoke_run / "results/smoke/report"
    claims = pd.read_csv(report / "claims.csv")
    statements = set(claims["statement"])
    for link in ("+Fix* > GRPO*", "+MTE > +Fix*", "+Sim > +MTE"):
        assert {f"ladder on validation: {link}", f"ladder on CompBench: {link}"} <= statements
    assert {
        "AR gradient norm lower with the frozen head (per-step probe)",
        "AR gradient variance lower with the frozen head (per-step probe)",
        "end-to-end GRPO ends below the base policy",
    } <= statements
    assert {"+Fix (committed) > GRPO*", "+Fix (committed) > +Sim"} <= statements
    assert any(s.startswith("k = 0.3 beats k = 0") for s in statements)  # (d) from the ablation grid
    assert {
        "RL on the head alone rises first (first validated step above the base)",
        "... then falls (last validated step below the first)",
    } <= statements  # (f) from the `head` variant
    assert set(claims["claim"]) == {
        "a",
        "b",
        "c",
        "d",
        "e",
        "f",
        "g",
        "h",
        "i",
        "j",
        "k",  # the climbing ladder: each rung against the shuffled control
    }  # h-j: the estimators, at the base
    assert {
        "+Fix lifts the validation reward above the base policy (last step)",
        "+Sim lifts the validation reward above the base policy (last step)",
    } <= statements  # (g) Table 1's lift
    numeric = claims[~claims["claim"].isin(["b", "h", "i", "j"])]  # h-j: 3 batch seeds in the smoke run
    assert np.isfinite(numeric[["diff", "lo", "hi"]].to_numpy()).all()
    assert set(claims["verdict"]) <= {"reproduced", "refuted", "not settled"}
    assert (numeric["ci"] == "bootstrap prompts x seeds").all()  # 2 seeds < 3
    paired = pd.read_csv(report / "claims_paired.csv")
    assert (paired["n_seeds"] == 2).all() and np.isfinite(paired[["diff", "boot_lo", "boot_hi"]].to_numpy()).all()
    assert "**Power.**" in (report / "claims.md").read_text()
    # the preference ladder's are decided again on the second seed set (seed 2); the climbing ladder trains seeds 0-1
    ladder = claims[claims["statement"].str.startswith("ladder on") & (claims["block"] == "toy-nova / toypref")]
    assert (ladder["replicate_n_seeds"] == 1).all() and set(ladder["replicate_verdict"]) <= {
        "reproduced",
        "refuted",
        "not settled",
    }
    assert all(
        b == (v if v == r else "differs")
        for v, r, b in zip(ladder["verdict"], ladder["replicate_verdict"], ladder["both"])
    )
    assert "second set" in (report / "claims.md").read_text()
    artifacts = pd.read_csv(
        report / "artifacts.csv"
    )  # Fig. 6's background energy, every ladder method against the base
    assert {"GRPO", "Head only", "+Sim"} <= set(artifacts["method"])
    compared = artifacts[artifacts["n_images"] > 0]  # the smoke's head-trained samples may be noise without background
    assert len(compared) and np.isfinite(compared["diff"]).all() and (artifacts["no_background"] >= 0).all()


def _chromium() -> str | None:
    """A headless-capable Chromium: found on PATH, else Debian's package installed when we are root."""
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    found = next(filter(None, map(shutil.which, names)), None)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in ("apt-get install -y -q chromium", "apt-get update -q && apt-get install -y -q chromium"):
            if subprocess.run(cmd, shell=True, env=env, capture_output=True, timeout=900).returncode == 0:
                break
        found = next(filter(None, map(shutil.which, names)), None)
    return found


# Opens every figure of the report in its own viewer (the report's `app`, as a click on the figure does), records
# each <img>'s decoded size in the title, and leaves the last figure on screen with its caption.
_SHOW_FIGURES = """<script>
window.addEventListener("load", () => setTimeout(async () => {
  const sizes = {};
  for (const path of Object.keys(results).filter(p => results[p].mime_type === "image/png")) {
    app.setView({content: "img", contentPath: results[path].data_uri, resultPath: path, navbarMode: "resultinfo"});
    await new Promise(done => setTimeout(done, 500));
    const img = [...document.images].find(i => i.src === results[path].data_uri);
    sizes[path] = img && img.complete ? [img.naturalWidth, img.naturalHeight] : null;
  }
  document.title = JSON.stringify(sizes);
}, 500));
</script>"""


@pytest.mark.slow
def test_html_report_builds_and_a_browser_renders_its_figures(smoke_run, tmp_path):
    """`snakemake --report`: every table and figure with its caption, by experiment; headless Chromium shows the
    figures."""
    assert snakemake(smoke_run).returncode == 0  # restores any output a test before this one removed
    html = tmp_path / "report.html"
    out = snakemake(smoke_run, "--report", str(html))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = html.read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\n", text, re.S).group(1))
    categories = json.loads(re.search(r"var categories = (\{.*?\});\n", text, re.S).group(1))
    report = "results/smoke/report"
    figures = [
        f"{report}/{f}.png"
        for f in (
            "fig2_dynamics",
            "fig4_uncertainty",
            "fig6_samples",
            "fig7a_samples",
            "fig7b_reward_curves",
            "fig7c_final_metric",
            "fig_estimators",
            "fig_checkpoint_gradients",
            "fig_climb",
        )
    ]
    tables = [f"{report}/{t}.csv" for t in ("table1", "table2", "val_gain", "claims", "artifacts", "estimators")]
    tables.append(f"{report}/checkpoint_gradients.csv")
    assert sorted(results) == sorted(tables + figures + [f.replace(".png", ".pdf") for f in figures])
    assert all("Config:" in r["caption"] for r in results.values())  # the caption names the config behind it
    assert "toy-nova" in results[f"{report}/table2.csv"]["caption"]  # rendered from the config, not a template
    assert {c.split(":")[0] for c in categories} == {"ladder", "table1", "ablations"}

    browser = _chromium()
    if browser is None:
        pytest.skip(
            "no Chromium found or installable (Debian: apt-get install chromium, as root) to render the report"
        )
    view = tmp_path / "view.html"
    head, body_end, tail = text.rpartition("</body>")
    view.write_text(head + _SHOW_FIGURES + body_end + tail)
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,900",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run([*flags, "--dump-dom", view.as_uri()], capture_output=True, text=True, timeout=300)
    sizes = json.loads(html_module.unescape(re.search(r"<title>(.*?)</title>", dom.stdout, re.S).group(1)))
    for path in figures:
        with Image.open(smoke_run / path) as png:
            assert sizes[path] == list(png.size), f"{path} not rendered: {sizes.get(path)}"
    shot = tmp_path / "screenshot.png"
    subprocess.run([*flags, f"--screenshot={shot}", view.as_uri()], capture_output=True, timeout=300)
    pixels = np.asarray(Image.open(shot).convert("RGB"))[:, 300:].reshape(-1, 3)  # the content pane: the last figure
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    drawn = (pixels != colours[counts.argmax()]).any(-1).mean()  # not the background colour (a blank page: 0)
    assert drawn > 0.01 and len(colours) > 100, f"the screenshot is blank: {drawn:.1%} drawn, {len(colours)} colours"


@pytest.mark.slow
def test_second_run_has_nothing_to_do_and_a_deleted_figure_reruns_alone(smoke_run):
    out = snakemake(smoke_run, "-n")
    assert out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr, out.stdout[-2000:]
    (smoke_run / "results/smoke/report/fig2_dynamics.png").unlink()
    out = snakemake(smoke_run, "-n")
    text = out.stdout + out.stderr
    assert "fig2_dynamics" in text and "train " not in text and "pretrain" not in text, text[-3000:]


@pytest.mark.slow
def test_changing_a_plot_option_reruns_plots_only(smoke_run, tmp_path):
    config = tmp_path / "smoke-plots.yaml"
    config.write_text(
        (REPO / "config/smoke.yaml")
        .read_text()
        .replace("report: {grid_prompts: 2}", "report: {grid_prompts: 2, confidence: 0.9}")
    )
    out = snakemake(smoke_run, "-n", configfile=config)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "fig6_samples" in text and "table2" in text, text[-3000:]  # they use the changed options
    for rule in ("rule train:", "rule pretrain:", "rule sample:", "rule eval_compbench:"):
        assert rule not in text, text[-3000:]


@pytest.mark.slow
def test_changing_what_rl_freezes_reruns_training_but_not_pretraining(smoke_run, tmp_path):
    config = tmp_path / "smoke-frozen.yaml"
    config.write_text(
        (REPO / "config/smoke.yaml")
        .read_text()
        .replace(
            "    sampling: {ar_steps: 4, diffusion_steps: 4}\n",
            "    sampling: {ar_steps: 4, diffusion_steps: 4}\n    rl_frozen: [blocks.0.]\n",
            1,
        )
    )
    refused = snakemake(smoke_run, "-n", configfile=config)  # results/smoke/ holds runs of other settings (issue 27)
    assert refused.returncode != 0 and "differing: policies.toy-nova.rl_frozen" in refused.stdout + refused.stderr
    work = tmp_path / "work"  # a copy whose owner lets the new settings replace the runs: the record goes
    shutil.copytree(smoke_run, work, symlinks=True)
    (work / "results/smoke/settings.json").unlink()
    out = snakemake(work, "-n", configfile=config)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "rule train:" in text and "policy=toy-nova" in text, text[-3000:]
    assert "rule pretrain:" not in text and "rule warmup:" not in text, text[-3000:]


@pytest.mark.slow
def test_configs_coexist_and_share_exactly_the_identical_stages(smoke_run, tmp_path):
    """Config B changes toy-nova's pre-training: it gets a folder of its own beside A's (A stays complete and
    untouched) and reuses everything else; config C differs from A only in name and reuses every shared stage."""
    work = tmp_path / "work"
    shutil.copytree(smoke_run, work, symlinks=True)
    smoke = (REPO / "config/smoke.yaml").read_text()
    b, c = tmp_path / "b.yaml", tmp_path / "c.yaml"
    b.write_text(
        smoke.replace("name: smoke", "name: smoke-b").replace(
            "pretrain: {steps: 10, batch_size: 8}", "pretrain: {steps: 12, batch_size: 8}", 1
        )
    )
    c.write_text(smoke.replace("name: smoke", "name: smoke-c"))
    dirs = {
        name: shared_dirs(load_config(path)) for name, path in (("a", REPO / "config/smoke.yaml"), ("b", b), ("c", c))
    }
    assert dirs["a"] == dirs["c"] and dirs["b"]["base"]["toy-nova"] != dirs["a"]["base"]["toy-nova"]
    assert {k: v for k, v in dirs["b"].items() if k != "base"} == {k: v for k, v in dirs["a"].items() if k != "base"}
    new = dirs["b"]["base"]["toy-nova"]

    text = (lambda out: out.stdout + out.stderr)(snakemake(work, "-n", configfile=b))
    assert text.count("rule pretrain:") == 1 and f"{new}/policy" in text, text[-3000:]
    for rule in ("rule train_toyclip:", "rule make_suites:", "rule warmup:"):  # shared with A: reused
        assert rule not in text, text[-3000:]
    before = {p: p.stat().st_mtime_ns for p in (work / "results").rglob("*") if p.is_file()}
    out = snakemake(work, f"{new}/policy", configfile=b)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((work / new / "spec.json").read_text())["policy_json"]["pretrain"]["steps"] == 12
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # nothing of A's was rewritten
    a_again = snakemake(work, "-n").stdout  # A is as complete as before (an earlier test deleted one of its figures)
    assert all(
        rule not in a_again
        for rule in ("rule pretrain:", "rule make_suites:", "rule train_toyclip:", "rule warmup:", "rule train:")
    ), a_again[-2000:]
    text = (lambda out: out.stdout + out.stderr)(snakemake(work, "-n", configfile=c))
    assert "results/smoke-c/train/" in text and "results/smoke-c/report/table2.csv" in text, text[-3000:]
    for rule in ("rule pretrain:", "rule train_toyclip:", "rule make_suites:", "rule warmup:"):
        assert rule not in text, text[-3000:]
    assert "results/smoke/" not in text  # the first experiment's outputs are not touched


@pytest.mark.slow
def test_the_test_command_passes_in_a_checkout_that_holds_a_smoke_run(smoke_run, tmp_path):
    """`make run` then `make test` in one checkout used to fail 3 dry-run tests ("Nothing to be done"):
    the workflow tests, run in a copy of the checkout holding the smoke run's results, still pass."""
    checkout = tmp_path / "checkout"
    shutil.copytree(
        REPO,
        checkout,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".venv*", "results", "logs", ".snakemake", ".git", "__pycache__", ".pytest_cache", "*.egg-info"
        ),
    )
    for name in ("results", "logs", ".snakemake"):
        shutil.copytree(smoke_run / name, checkout / name, symlinks=True)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow and not slurm",
            "tests/test_workflow_config.py",
            "-k",
            "dry_run or ladder or profile",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]


@pytest.mark.slow
def test_a_killed_training_job_resumes_with_rerun_incomplete(smoke_run, tmp_path):
    """SIGKILL the whole snakemake process group after the first GRPO checkpoint; the rerun resumes it."""
    config = tmp_path / "smoke-long.yaml"  # more steps, so that the kill lands mid-run
    config.write_text((REPO / "config/smoke.yaml").read_text().replace("grpo: {steps: 2,", "grpo: {steps: 40,"))
    work = tmp_path / "work"  # a copy: the other tests keep the smoke run as it was
    shutil.copytree(smoke_run, work, symlinks=True)
    run = work / "results/smoke/train/toy-nova/toypref/fix/seed0"
    shutil.rmtree(run)  # outputs and state of the short run: this one starts from nothing
    (work / "results/smoke/settings.json").unlink()  # under other settings (more steps): deliberately
    target = str(run.relative_to(work) / "summary.json")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    cmd = [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        "--configfile",
        str(config),
        "--cores",
        "1",
        target,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not (run / "state/trainer.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run / "state/trainer.pt").exists() and not (run / "summary.json").exists(), "the kill did not land mid-run"
    assert snakemake(work, "--unlock", configfile=config).returncode == 0  # a hard kill leaves snakemake's lock
    out = snakemake(work, "--rerun-incomplete", target, configfile=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = (work / "logs/smoke/train/toy-nova/toypref/fix/seed0.log").read_text()
    assert "resumed from" in log and (run / "summary.json").exists(), log[-2000:]


@pytest.mark.slow
def test_the_smoke_dag_takes_its_toy_stages_from_a_release(smoke_run, tmp_path):
    """toy_weights: shipped (the default) places the release's folders, byte for byte the ones the pipeline trained,
    instead of training them; `train` trains every stage; a changed byte is refused naming its file; a folder
    trained by other code is trained again, and the DAG says why."""
    release = tmp_path / "release"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    packed = subprocess.run(
        [str(Path(sys.executable).with_name("margrpo")), "pack-weights", "--config", str(REPO / "config/smoke.yaml")]
        + ["--accept-weak-base", "smoke-sized bases (10 steps)"]
        + ["--results", str(smoke_run / "results"), "--release", str(release)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert packed.returncode == 0, packed.stderr[-3000:]
    manifest = json.loads((release / "manifest.json").read_text())
    assert sorted(e["stage"] for e in manifest["folders"].values()) == [
        "pretrain",
        "pretrain",
        "pretrain",
        "toyclip",
        "toypref",
    ]
    smoke = (REPO / "config/smoke.yaml").read_text()
    shipped, trained = tmp_path / "shipped.yaml", tmp_path / "trained.yaml"
    shipped.write_text(smoke + f"\ntoy_release: {release}\n")
    trained.write_text(smoke + f"\ntoy_release: {release}\ntoy_weights: train\n")

    work = tmp_path / "work"
    out = snakemake(work, "trained_toy_stages", configfile=shipped)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "rule place_pretrained:" in text and "rule place_toyclip:" in text and "rule place_toypref:" in text
    assert "rule pretrain:" not in text and "rule train_toyclip:" not in text, text[-4000:]
    for key, entry in manifest["folders"].items():
        for name in entry["files"]:
            assert (work / "results" / key / name).read_bytes() == (smoke_run / "results" / key / name).read_bytes()

    dry = snakemake(tmp_path / "fresh", "-n", "trained_toy_stages", configfile=trained)
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0 and "rule pretrain:" in text and "rule train_toypref:" in text, text[-4000:]
    assert "place_" not in text, text[-4000:]

    key = next(k for k in manifest["folders"] if k.startswith("pretrain/toy-nova"))
    weights = release / key / "policy" / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 1
    weights.write_bytes(bytes(damaged))
    shutil.rmtree(work / "results" / key)
    out = snakemake(work, "trained_toy_stages", configfile=shipped)
    assert out.returncode != 0
    log = (work / "logs/place_weights" / f"{Path(key).name}.log").read_text()
    assert "policy/model.safetensors: its sha256 differs" in log, log[-2000:]
    assert not (work / "results" / key / "policy").exists()

    manifest["folders"][key]["source_digest"] = "0" * 64  # as if trained by other code
    (release / "manifest.json").write_text(json.dumps(manifest))
    dry = snakemake(work, "-n", "trained_toy_stages", configfile=shipped)
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0 and "rule pretrain:" in text, text[-4000:]
    assert f"{key} is trained here: the code of its stage (pretrain) changed" in text
    assert "make toy-weights" in text
