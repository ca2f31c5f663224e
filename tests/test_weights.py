"""Released weights: repository ids resolved offline from a constructed Hugging Face cache, `margrpo weights`
on the paper configs, and docs/real-scale.md's weights table from the same list."""

import re
from pathlib import Path

import pytest

from margrpo.cli import main
from margrpo.experiment.config import load_config
from margrpo.infra.weights import (
    SOURCES,
    RepoRef,
    check,
    markdown_table,
    needs,
    parse_repo_id,
    resolve_weights,
)

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(hub: Path, repo: str, files: dict[str, bytes], revision: str = "main", commit: str = COMMIT) -> Path:
    """huggingface_hub's layout: blobs/<hash>, snapshots/<commit>/<file> -> ../../blobs/<hash>, refs/<revision>."""
    base = hub / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / commit
    for i, (name, data) in enumerate(files.items()):
        blob = base / "blobs" / f"{commit[:8]}{i:032d}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face home; the hub stays offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hf" / "hub"


def test_repository_ids_parse_and_paths_do_not():
    assert parse_repo_id("BAAI/nova-d48w1024-sd512") == RepoRef("BAAI/nova-d48w1024-sd512")
    assert parse_repo_id("wusize/Harmon-1_5B@v1.0") == RepoRef("wusize/Harmon-1_5B", "v1.0")
    assert parse_repo_id("/abs/folder") is None and parse_repo_id("./a/b") is None and parse_repo_id("a/b/c") is None
    assert RepoRef("xswu/HPSv2").download_command(["HPS_v2.1_compressed.pt"], "w") == (
        "hf download xswu/HPSv2 HPS_v2.1_compressed.pt --local-dir w"
    )


def test_a_repository_id_resolves_offline_from_the_cache(hub):
    snapshot = cache_repo(hub, "BAAI/nova-d48w1024-sd512", {"model_index.json": b"{}", "vae/config.json": b"{}"})
    assert resolve_weights("BAAI/nova-d48w1024-sd512") == snapshot
    assert resolve_weights(f"BAAI/nova-d48w1024-sd512@{COMMIT}") == snapshot  # a commit names its snapshot
    assert (resolve_weights("BAAI/nova-d48w1024-sd512") / "vae" / "config.json").read_bytes() == b"{}"
    cache_repo(hub, "BAAI/nova-d48w1024-sd512", {"model_index.json": b"{}"}, "v2", "f" * 40)
    assert resolve_weights("BAAI/nova-d48w1024-sd512@v2").name == "f" * 40  # a tag through refs/
    local = Path("BAAI/nova-d48w1024-sd512")
    local.mkdir(parents=True)
    assert resolve_weights("BAAI/nova-d48w1024-sd512") == local  # a path that exists wins


def test_a_missing_repository_names_the_hf_download_command(hub):
    with pytest.raises(FileNotFoundError, match=r"not in the Hugging Face cache.*`hf download wusize/Harmon-1_5B`"):
        resolve_weights("wusize/Harmon-1_5B")
    with pytest.raises(FileNotFoundError, match=r"`hf download wusize/Harmon-1_5B --revision dev`"):
        resolve_weights("wusize/Harmon-1_5B@dev")
    finding = check(needs({"reward_models": {"hpsv2": {"path": "xswu/HPSv2"}}})[0])
    assert not finding.ok and finding.command == "hf download xswu/HPSv2 HPS_v2.1_compressed.pt"


def test_check_lists_found_files_with_sizes(hub):
    cache_repo(hub, "IDEA-Research/grounding-dino-tiny", {"config.json": b"{}", "model.safetensors": b"x" * 10})
    config = {"reward_models": {"grounding_dino": {"path": "IDEA-Research/grounding-dino-tiny"}}}
    finding = check(needs(config)[0])
    assert finding.found is not None and ("model.safetensors", 10) in finding.files
    assert any("preprocessor_config.json" in m for m in finding.missing)  # its processor files are not there
    assert finding.command == "hf download IDEA-Research/grounding-dino-tiny"


def test_a_local_path_missing_gets_the_known_repository_into_that_path(hub):
    config = {"reward_models": {"imagereward": {"path": "weights/rewards/ImageReward.pt"}}}
    finding = check(needs(config)[0])
    assert not finding.ok
    assert finding.command == "hf download THUDM/ImageReward ImageReward.pt --local-dir weights/rewards"
    Path("weights/rewards").mkdir(parents=True)
    Path("weights/rewards/ImageReward.pt").write_bytes(b"pt")
    assert check(needs(config)[0]).ok


@pytest.mark.parametrize("name", ["paper-nova", "paper-harmon"])
def test_margrpo_weights_lists_every_model_of_a_paper_config_and_fails_on_an_empty_cache(hub, name, capsys):
    config_file = ROOT / "config" / f"{name}.yaml"
    with pytest.raises(SystemExit) as stop:
        main(["weights", "--config", str(config_file)])
    assert stop.value.code not in (0, None)
    out = capsys.readouterr().out
    listed = needs(load_config(config_file))
    assert len(listed) >= 10
    for need in listed:
        assert f"{need.key} = {need.value}: MISSING" in out
        assert need.source is not None, need.key  # every key of the paper configs has a known source
    assert out.count("fetch: hf download ") == len(listed)
    assert f"{len(listed)} models, {len(listed)} missing" in out
    policy = "BAAI/nova-d48w1024-sd512" if name == "paper-nova" else "wusize/Harmon-1_5B"
    assert f"fetch: hf download {policy}" in out and "IDEA-Research/grounding-dino-tiny" in out


def test_the_paper_configs_use_the_official_detection_reward():
    for name in ("paper-nova", "paper-harmon"):
        config = load_config(ROOT / "config" / f"{name}.yaml")
        assert config["reward_models"]["grounding_dino"]["path"].endswith("grounding-dino-tiny")
    assert SOURCES["reward_models.grounding_dino.path"].repo == "IDEA-Research/grounding-dino-tiny"


def test_the_documented_table_is_the_weights_list():
    page = (ROOT / "docs" / "real-scale.md").read_text()
    assert markdown_table() in page
    for key in SOURCES:
        assert re.search(re.escape(f"`{key}"), page), key


def test_a_reward_models_folder_may_name_a_cached_repository(hub):
    """The real scorers' model folders resolve through the same lookup (a file option, such as HPS's .pt, stays a
    path): a cached repository is found, a missing one names the `hf download` command and the config key."""
    from margrpo.rewards.real._common import _require_pretrained

    snapshot = cache_repo(hub, "IDEA-Research/grounding-dino-tiny", {"config.json": b"{}", "model.safetensors": b""})
    assert _require_pretrained("IDEA-Research/grounding-dino-tiny", "grounding_dino", "path", "hub") == snapshot
    with pytest.raises(FileNotFoundError, match=r"reward_models\.git_vqa\.path: .*`hf download microsoft/git-large"):
        _require_pretrained("microsoft/git-large-vqav2", "git_vqa", "path", "hub")
