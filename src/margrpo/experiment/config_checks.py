"""Config checks that read the settings as their stages do (margrpo.experiment.config.validate_config calls
them), and the check of the config files a `make run` / `make report` command line names, before Snakemake
renders them.

The world a config describes must build, and its suites must fit in it (`check_world`); Table 3's related
entries are read into the dataclasses of the stages that take them (`check_related`). Errors name the key path.
"""

from __future__ import annotations

from margrpo.experiment.schema import ConfigError, check_schema, read_config_file, schema_section
from margrpo.infra.io import InputError


def world_config(world: dict):
    """The WorldConfig `make-suites` builds from the config's `world` section (the toy32 preset and these knobs)."""
    from margrpo.world.config import PRESETS, world_from_knobs

    return world_from_knobs(PRESETS["toy32"], world)


def world_capacity(cfg) -> dict[str, int]:
    """Per category, an upper bound on the distinct prompts (canonical specs) the world's captions can make: the
    sets of at most max_objects phrases over the attributes each category names (margrpo.world.captions), and for
    the relations, ordered pairs in 3 canonical directions. A suite asking for more can never be drawn."""
    from math import comb

    P, S, T, m = len(cfg.palette), len(cfg.shapes), len(cfg.textures), cfg.max_objects
    sets = lambda n: comb(n + m, m)  # noqa: E731  # multisets of at most m phrases of n kinds: bounds every phrase list
    return {
        "color": sets(P * S),
        "shape": sets((P + 1) * S),
        "texture": sets((P + 1) * S * T),
        "spatial": 3 * ((P + 1) * S) ** 2,
        "numeracy": sets(S) * (P + 1) ** S,
        "complex": sets(P * S * T) + 3 * (P * S * (T + 1)) ** 2 + sets(P * S),
    }


def check_world(config: dict, source: str) -> None:
    """The ShapesWorld knobs must build a world, and the suites' sizes fit in it (make-suites would search for
    prompts that do not exist, then fail)."""
    p = config["prompts"]
    if p["source"] != "shapesworld":
        return
    from margrpo.world.config import CATEGORIES

    try:
        cfg = world_config(config["world"])
    except ValueError as err:
        raise ConfigError(f"{source}: key 'world': {err}") from None
    capacity, used = world_capacity(cfg), dict.fromkeys(CATEGORIES, 0)
    for split in ("eval", "val", "train"):  # make-suites' order: each split avoids the prompts of those before it
        base, rest = divmod(p[f"n_{split}"], len(CATEGORIES))
        for i, category in enumerate(CATEGORIES):
            used[category] += base + (i < rest)
            if used[category] > capacity[category]:
                raise ConfigError(
                    f"{source}: key 'prompts.n_{split}': {p[f'n_{split}']} prompts ask for {used[category]} distinct "
                    f"{category} prompts (with the splits drawn before it), but this world (world.palette_size "
                    f"{len(cfg.palette)}, max_objects {cfg.max_objects}) has at most {capacity[category]}"
                )


def check_related(config: dict, source: str) -> None:
    """Table 3's policy and method entries, read as their stages read them (unknown keys, bad values)."""
    related = config["experiments"]["related"]
    if not related["enabled"]:
        return
    from margrpo.infra.readers import dataclass_from
    from margrpo.related.marval import MARVALConfig, MARVALRLConfig
    from margrpo.related.maskgrpo.policy import ToyMaskConfig
    from margrpo.related.maskgrpo.pretraining import MaskPretrainConfig
    from margrpo.related.maskgrpo.rollout import MaskSamplingConfig
    from margrpo.related.maskgrpo.trainer import MaskGRPOConfig
    from margrpo.world import prompt_vocabulary

    def read(cls, section: str, fixed: dict | None = None):
        node = related
        for part in section.split("."):
            node = node[part]
        try:
            dataclass_from(cls, node, f"{source}: key 'experiments.related.{section}'", fixed)
        except InputError as err:
            raise ConfigError(str(err)) from None

    world = world_config(config["world"]).to_dict() if config["prompts"]["source"] == "shapesworld" else None
    read(ToyMaskConfig, "mask.model", {"world": world, "vocab": prompt_vocabulary()} if world else {"vocab": []})
    read(MaskPretrainConfig, "mask.pretrain")
    read(MaskSamplingConfig, "mask.sampling")
    read(MARVALConfig, "marval.distill")
    check_schema(
        schema_section("policies.*.sampling"),
        related["marval"]["sampling"],
        source,
        fill=False,
        at="experiments.related.marval.sampling",
    )
    for method in ("grpo-mask", "maskgrpo"):
        read(MaskGRPOConfig, f"settings.{method}", {"method": "grpo" if method == "grpo-mask" else "mask_grpo"})
    read(MARVALRLConfig, "settings.marval-rl", {"toyclip_weight": 1.0, "shapes_weight": 0.0})
    check_schema(
        schema_section("grpo"),
        related["settings"]["grpo-onestep"],
        source,
        fill=False,
        at="experiments.related.settings.grpo-onestep",
    )


def snakemake_config_files(argv: list[str]) -> list[str]:
    """The files a Snakemake command line names with --configfile(s) (several may follow one flag, or `=file`)."""
    files, taking = [], False
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in ("--configfile", "--configfiles"):
            taking = not eq
            files += [value] if eq else []
        elif arg.startswith("-"):
            taking = False
        elif taking:
            files.append(arg)
    return files


def main(argv: list[str] | None = None) -> int:
    """`python -m margrpo.experiment.config_checks <snakemake arguments>` (make run / make report): read the
    config files they name with margrpo's own reader before Snakemake starts, which renders a YTE template
    (running its code) at load."""
    import sys

    for path in snakemake_config_files(sys.argv[1:] if argv is None else argv):
        try:
            read_config_file(path)
        except ConfigError as err:
            print(f"margrpo: error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
