"""ShapesWorld vocabulary and the one typed config of the toy world.

The defaults are chosen for learnability by a ~3M-parameter MAR at 32 px with 4x4 pixel-patch
tokens, and for a parser that stays exact on blurred, noisy images (benchmarks/parser_accuracy.py):
objects of 11-12 px centred in the 16-px cells of a 2x2 grid (a 4x4-token block each), six
maximally separated colours, a 4-px background gap between objects (at 3 px, same-colour neighbours
merged after blur: measured), and two textures, solid and hollow.

"striped" is implemented but opt-in: at 32 px the thin bands of a striped triangle or circle
vanish under a 1-px blur (their shapes parse right 51% / 84% of the time, measured), while at 64 px
(`PRESETS["toy64"]`) striped parses as well as the others. With grid=2 and 11-12 px objects the
4-px gap leaves no room for jitter, so objects sit exactly at their cell centres; jitter applies
where cells are larger.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# Saturated colours: every entry has max channel 255, so the parser can tell colour from
# background by brightness and colour from colour by chromaticity (rgb / max(rgb)).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "magenta": (255, 0, 255),
    "cyan": (0, 255, 255),
    "orange": (255, 128, 0),  # not in the default palette: closer to red/yellow (chroma distance 0.5)
    "white": (255, 255, 255),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
TEXTURES: tuple[str, ...] = ("solid", "hollow", "striped")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below", "next to")
# T2I-CompBench categories that the parser can verify. "3d_spatial" (occlusion) is left out:
# objects never overlap in this world, and an occluded outline/stripe pattern cannot be told
# apart from a broken one in a generated image, so its score would not be exact.
CATEGORIES: tuple[str, ...] = ("color", "shape", "texture", "spatial", "numeracy", "complex")

DEFAULT_PALETTE: tuple[str, ...] = ("red", "green", "blue", "yellow", "magenta", "cyan")
MAX_BACKDROP = 0.3  # the brightest backdrop a world may render (fraction of range); see WorldConfig.backdrop_range


@dataclass(frozen=True)
class WorldConfig:
    """Knobs of ShapesWorld; all lengths in pixels of the final image."""

    image_size: int = 32  # square images, 32..64 px; the toy policy uses 4x4 pixel patches
    grid: int = 2  # objects are placed in the cells of a grid x grid layout (2 -> 16 px cells at 32 px)
    snap: bool = True  # True: centre of a cell (+ jitter); False: free placement without overlap
    jitter_px: int = 1  # max offset of an object from its cell centre (clamped to keep min_gap_px)
    # object diameter / side / triangle base (= height), inclusive; at 10 px a hollow triangle's hole closes under blur
    size_range: tuple[int, int] = (11, 12)
    min_gap_px: int = 4  # background between any two objects, so blurred neighbours stay separate
    max_objects: int = 4  # 1..max_objects objects per random scene
    palette: tuple[str, ...] = DEFAULT_PALETTE
    shapes: tuple[str, ...] = SHAPES
    textures: tuple[str, ...] = ("solid", "hollow")  # + "striped" at 64 px, see the module docstring
    line_px: int = 2  # outline width of hollow objects (1 px vanishes under a 1-px blur)
    stripe_period_px: int = 4  # striped objects: vertical bands, half on, half off
    supersample: int = 4  # anti-aliasing: render at supersample x resolution, box-downsample
    n_heldout_pairs: int = 3  # (colour, shape) pairs never used in training scenes / train+val prompts
    heldout_seed: int = 0  # which pairs are held out (fixed per world, recorded in world.json)
    # the world's aesthetic, named by no caption: a scene's backdrop is a grey of this brightness (fraction of range),
    # drawn per scene (0, 0: black, as before toy revision 3). Its top stays well under the parser's foreground
    # threshold (0.5), so the parser reads the same objects on any backdrop (benchmarks/parser_accuracy.py)
    backdrop_range: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        # JSON round trips give lists; store tuples so the config stays hashable.
        for name in ("size_range", "palette", "shapes", "textures", "backdrop_range"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not 32 <= self.image_size <= 64:
            raise ValueError(
                f"image_size={self.image_size} is outside 32..64; the toy policy and parser are tuned for that range"
            )
        if self.grid < 1:
            raise ValueError(f"grid={self.grid} must be >= 1")
        lo, hi = self.size_range
        if not 4 <= lo <= hi:
            raise ValueError(f"size_range={self.size_range} must satisfy 4 <= min <= max")
        if hi < 2 * self.line_px + 3:
            raise ValueError(
                f"size_range max {hi} leaves no interior inside a {self.line_px}-px outline; "
                f"raise it to >= {2 * self.line_px + 3}"
            )
        if not 1 <= self.max_objects <= 9:
            raise ValueError(f"max_objects={self.max_objects} must be in 1..9 (prompts spell counts as words)")
        self._check_placement(hi)
        for name, vocab in (("palette", PALETTE), ("shapes", SHAPES), ("textures", TEXTURES)):
            values = getattr(self, name)
            unknown = [v for v in values if v not in vocab]
            if unknown or not values or len(set(values)) != len(values):
                raise ValueError(f"{name}={values} must be distinct, non-empty values from {tuple(vocab)}")
        blo, bhi = self.backdrop_range
        if not 0.0 <= blo <= bhi <= MAX_BACKDROP:
            raise ValueError(
                f"backdrop_range={self.backdrop_range} must satisfy 0 <= min <= max <= {MAX_BACKDROP} (brighter "
                "backdrops come too near the parser's foreground threshold of 0.5)"
            )
        if self.line_px < 1 or self.stripe_period_px < 2:
            raise ValueError("line_px must be >= 1 and stripe_period_px >= 2")
        if self.supersample < 1:
            raise ValueError(f"supersample={self.supersample} must be >= 1")
        if not 0 <= self.n_heldout_pairs <= len(self.palette) or (self.n_heldout_pairs and len(self.shapes) < 2):
            raise ValueError(
                f"n_heldout_pairs={self.n_heldout_pairs} must be in 0..{len(self.palette)} (one per colour) "
                "and needs >= 2 shapes, so that every colour and shape still appears in training"
            )

    def _check_placement(self, hi: int) -> None:
        """Objects up to `hi` px must fit where the scene places them (one per grid cell with snap, else anywhere
        without overlap), with gaps the parser does not bridge."""
        if self.snap:
            cell = self.image_size / self.grid
            if hi + self.min_gap_px > cell:
                raise ValueError(
                    f"objects of {hi} px plus a {self.min_gap_px}-px gap do not fit in {cell:g}-px cells; "
                    f"lower size_range max to {int(cell) - self.min_gap_px}, lower grid, or raise image_size"
                )
            if self.max_objects > self.grid**2:
                raise ValueError(
                    f"max_objects={self.max_objects} exceeds the {self.grid**2} cells; raise grid or set snap=False"
                )
        elif self.max_objects * (hi + self.min_gap_px) ** 2 > 0.5 * self.image_size**2:
            raise ValueError(
                f"snap=False cannot place {self.max_objects} objects of {hi} px with {self.min_gap_px}-px gaps in "
                f"{self.image_size} px without overlap reliably; lower max_objects or size_range, or use snap=True"
            )
        if self.min_gap_px < 2 * self.bridge_px + 2:
            raise ValueError(
                f"min_gap_px={self.min_gap_px} lets the parser merge neighbours across its "
                f"{self.bridge_px}-px crack bridge; set min_gap_px >= {2 * self.bridge_px + 2}"
            )

    @property
    def bridge_px(self) -> int:
        """Dilation radius the parser uses to re-join an object's pieces (merges gaps up to 2x this).

        Striped objects are bands separated by stripe_period_px / 2 of background, so the bridge
        must span that; min_gap_px must exceed it so that neighbouring objects never merge.
        """
        return max(1, -(-self.stripe_period_px // 4)) if "striped" in self.textures else 1

    def heldout_pairs(self) -> frozenset[tuple[str, str]]:
        """(colour, shape) pairs reserved for evaluation (like T2I-CompBench's val_unseen).

        Drawn from `heldout_seed` with distinct colours and shapes spread round-robin: every colour
        and every shape still appears in training, only the combination is new.
        """
        rng = np.random.default_rng(np.random.SeedSequence([self.heldout_seed, 0x5EED]))
        colors = [self.palette[i] for i in rng.permutation(len(self.palette))]
        shapes = [self.shapes[i] for i in rng.permutation(len(self.shapes))]
        pairs = [(colors[i], shapes[i % len(shapes)]) for i in range(self.n_heldout_pairs)]
        return frozenset(pairs)

    def to_dict(self) -> dict:
        return {
            f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in dataclasses.fields(self)
        }

    @classmethod
    def from_dict(cls, data: dict) -> WorldConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown WorldConfig keys {unknown}; expected a subset of {sorted(known)}")
        return cls(**data)


def world_from_knobs(base: WorldConfig, knobs: dict) -> WorldConfig:
    """`base` with a config's world knobs: WorldConfig fields, plus `palette_size` (the first N colours of PALETTE) and
    `backdrop_max` (backdrops drawn from black to this grey). One reading for `make-suites` and the dry run."""
    fields = {k: v for k, v in knobs.items() if k not in ("palette_size", "backdrop_max")}
    if knobs.get("palette_size") is not None:
        if "palette" in fields:
            raise ValueError("give palette or palette_size, not both")
        fields["palette"] = tuple(PALETTE)[: knobs["palette_size"]]
    if knobs.get("backdrop_max") is not None:
        fields["backdrop_range"] = (0.0, knobs["backdrop_max"])
    return dataclasses.replace(base, **fields)


# Size presets: the 32-px default and a 64-px world in which stripes survive blur (measured).
PRESETS: dict[str, WorldConfig] = {
    "toy32": WorldConfig(),
    # the pipeline's default world (workflow schema): 64 px, 4 x 4 cells of 16 px, one toy-MAR token each
    "grid4": WorldConfig(image_size=64, grid=4),
    # the pipeline's world since toy revision 3: grid4 on a backdrop that varies per scene, the preference
    # reward's aesthetic
    "grid4-lit": WorldConfig(image_size=64, grid=4, backdrop_range=(0.0, 0.2)),
    "toy64": WorldConfig(
        image_size=64, size_range=(20, 24), min_gap_px=6, jitter_px=2, line_px=4, stripe_period_px=8, textures=TEXTURES
    ),
}
