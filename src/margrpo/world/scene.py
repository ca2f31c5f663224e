"""Scene model, random scenes, the anti-aliased renderer and the spatial-relation rule.

Every shape is drawn from a signed distance `d(x, y)` (>= 0 inside, = distance to the outline),
so the three textures are one line each: solid `d >= 0`, hollow `0 <= d < line`, striped = the
shape cut into vertical bands (half on, half off, one band centred on the object). Striped has no
outline on purpose: at 32 px an outline leaves a triangle no room for a visible stripe, and
"outline + stripes" then parses as "hollow" (measured), whereas bands and a ring stay distinct.
Bands are vertical because horizontal ones cut off a triangle's thin apex under blur (measured);
the centre band runs from apex to base. Coordinates are continuous image pixels: pixel (row i, col j) covers
[j, j+1) x [i, i+1), its centre is (j + 0.5, i + 0.5); y grows downwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from margrpo.world.config import PALETTE, RELATIONS, WorldConfig


@dataclass(frozen=True)
class ObjectSpec:
    """One object; (cx, cy) is the centre of its bounding box, size its diameter / side / base."""

    color: str
    shape: str
    texture: str
    size: int
    cx: float
    cy: float

    @property
    def centroid(self) -> tuple[float, float]:
        """Centre of mass of the filled shape (a triangle's lies a sixth of its height below the box centre)."""
        return (self.cx, self.cy + self.size / 6) if self.shape == "triangle" else (self.cx, self.cy)

    @property
    def bbox(self) -> tuple[float, float, float, float]:
        h = self.size / 2
        return (self.cx - h, self.cy - h, self.cx + h, self.cy + h)


@dataclass(frozen=True)
class Scene:
    """Objects on a grey backdrop of brightness `backdrop` (0: black): the scene's aesthetic, which no caption
    names."""

    objects: tuple[ObjectSpec, ...]
    backdrop: float = 0.0


def sample_backdrop(rng: np.random.Generator, cfg: WorldConfig) -> float:
    """A scene's backdrop brightness, uniform over the world's range (no draw for a one-value range: older worlds'
    random streams are unchanged)."""
    lo, hi = cfg.backdrop_range
    return lo if lo == hi else float(rng.uniform(lo, hi))


# ---------------------------------------------------------------- spatial relations


def relation_holds(a: tuple[float, float], b: tuple[float, float], relation: str, margin: float = 0.0) -> bool:
    """Does `a <relation> b` hold between two centroids? The relation's axis must dominate.

    "left of" means b lies to the right of a by more than `margin` and more to the side than
    above/below (like T2I-CompBench's detector-based spatial score); "next to" is "left of" or
    "right of".
    """
    dx, dy = b[0] - a[0], b[1] - a[1]  # y grows downwards
    if relation == "left of":
        return dx > margin and dx > abs(dy)
    if relation == "right of":
        return -dx > margin and -dx > abs(dy)
    if relation == "above":
        return dy > margin and dy > abs(dx)
    if relation == "below":
        return -dy > margin and -dy > abs(dx)
    if relation == "next to":
        return abs(dx) > margin and abs(dx) > abs(dy)
    raise ValueError(f"Unknown relation: {relation!r}; expected one of {RELATIONS}")


def clear_relations(a: tuple[float, float], b: tuple[float, float], slack: float) -> list[str]:
    """Relations that hold with `slack` to spare on the dominant axis (used to write unambiguous captions)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    if abs(dx) >= abs(dy) + slack:
        return ["left of" if dx > 0 else "right of", "next to"]
    if abs(dy) >= abs(dx) + slack:
        return ["above" if dy > 0 else "below"]
    return []


# ---------------------------------------------------------------- placement


def _snap_position(rng: np.random.Generator, cfg: WorldConfig, cell_index: int, size: int) -> tuple[float, float]:
    """Cell centre plus integer jitter, kept min_gap_px / 2 inside the cell edges (so neighbours
    stay min_gap_px apart). Centres are whole pixels, so a striped object's centre band is
    pixel-aligned."""
    cell = cfg.image_size / cfg.grid
    row, col = divmod(cell_index, cfg.grid)
    centre = []
    for start in (col * cell, row * cell):
        lo, hi = start + (size + cfg.min_gap_px) / 2, start + cell - (size + cfg.min_gap_px) / 2  # allowed centres
        target = round(start + cell / 2) + int(rng.integers(-cfg.jitter_px, cfg.jitter_px + 1))
        centre.append(
            float(np.clip(target, np.ceil(lo), np.floor(hi)))
            if np.ceil(lo) <= np.floor(hi)
            else float(round((lo + hi) / 2))
        )
    return centre[0], centre[1]


def _separated(box_a, box_b, gap: float) -> bool:
    return (
        box_a[0] >= box_b[2] + gap
        or box_b[0] >= box_a[2] + gap
        or box_a[1] >= box_b[3] + gap
        or box_b[1] >= box_a[3] + gap
    )


def _free_positions(rng, cfg: WorldConfig, sizes, accept=None, tries: int = 2000) -> list[tuple[float, float]]:
    """Rejection-sample non-overlapping integer centres (plus the optional `accept(positions)` test)."""
    for _ in range(tries):
        positions, boxes = [], []
        for size in sizes:
            lo, hi = size / 2 + 1, cfg.image_size - size / 2 - 1
            x, y = (float(v) for v in rng.integers(int(np.ceil(lo)), int(np.floor(hi)) + 1, size=2))
            box = (x - size / 2, y - size / 2, x + size / 2, y + size / 2)
            if not all(_separated(box, other, cfg.min_gap_px) for other in boxes):
                break
            positions.append((x, y))
            boxes.append(box)
        if len(positions) == len(sizes) and (accept is None or accept(positions)):
            return positions
    raise RuntimeError(
        f"could not place objects of sizes {list(sizes)} in {tries} tries; use snap=True or smaller objects"
    )


def place(
    rng: np.random.Generator, cfg: WorldConfig, sizes: list[int], cells: list[int] | None = None, accept=None
) -> list[tuple[float, float]]:
    """Centres for objects of the given sizes: distinct grid cells (snap; `cells` to choose them) or
    free non-overlapping spots (redrawn until `accept(positions)` holds, if given)."""
    if not cfg.snap:
        return _free_positions(rng, cfg, sizes, accept)
    if cells is None:
        cells = rng.choice(cfg.grid**2, size=len(sizes), replace=False).tolist()
    return [_snap_position(rng, cfg, c, s) for c, s in zip(cells, sizes)]


# ---------------------------------------------------------------- random scenes


def sample_attributes(rng: np.random.Generator, cfg: WorldConfig, allow_heldout: bool = False) -> tuple[str, str, str]:
    """Random (colour, shape, texture); held-out (colour, shape) pairs are redrawn unless allowed."""
    heldout = set() if allow_heldout else cfg.heldout_pairs()
    while True:
        color, shape = cfg.palette[rng.integers(len(cfg.palette))], cfg.shapes[rng.integers(len(cfg.shapes))]
        if (color, shape) not in heldout:
            return color, shape, cfg.textures[rng.integers(len(cfg.textures))]


def sample_scene(
    rng: np.random.Generator, cfg: WorldConfig, n_objects: int | None = None, allow_heldout: bool = False
) -> Scene:
    """A random scene of 1..max_objects objects.

    By default no object takes a held-out (colour, shape) pair, so pre-training pairs drawn with
    this function never show the evaluation suite's unseen combinations.
    """
    n = int(rng.integers(1, cfg.max_objects + 1)) if n_objects is None else n_objects
    if not 1 <= n <= cfg.max_objects:
        raise ValueError(f"n_objects={n} must be in 1..{cfg.max_objects}")
    attrs = [sample_attributes(rng, cfg, allow_heldout) for _ in range(n)]
    sizes = rng.integers(cfg.size_range[0], cfg.size_range[1] + 1, size=n).tolist()
    centres = place(rng, cfg, sizes)
    objects = tuple(ObjectSpec(c, s, t, int(z), x, y) for (c, s, t), z, (x, y) in zip(attrs, sizes, centres))
    return Scene(objects, sample_backdrop(rng, cfg))


# ---------------------------------------------------------------- rendering


def _signed_distance(shape: str, x: np.ndarray, y: np.ndarray, obj: ObjectSpec) -> np.ndarray:
    """Distance to the outline, positive inside (exact for circle and square, per-edge for triangle)."""
    dx, dy, h = x - obj.cx, y - obj.cy, obj.size / 2
    if shape == "circle":
        return h - np.hypot(dx, dy)
    if shape == "square":
        return np.minimum(h - np.abs(dx), h - np.abs(dy))
    if shape == "triangle":  # apex (cx, cy - h), base from (cx - h, cy + h) to (cx + h, cy + h)
        side = (dy + h - 2 * np.abs(dx)) / np.sqrt(5.0)  # distance to the two slanted edges
        return np.minimum(h - dy, side)
    raise ValueError(f"Unknown shape: {shape!r}")


def _coverage(obj: ObjectSpec, cfg: WorldConfig, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    d = _signed_distance(obj.shape, x, y, obj)
    inside = d >= 0
    if obj.texture == "solid":
        return inside
    if obj.texture == "hollow":
        return inside & (d < cfg.line_px)
    if obj.texture == "striped":  # vertical bands, one centred on cx: keeps a triangle's apex, no outline
        p = cfg.stripe_period_px
        return inside & (np.mod(x - obj.cx + p / 4, p) < p / 2)
    raise ValueError(f"Unknown texture: {obj.texture!r}")


def render(scene: Scene, cfg: WorldConfig) -> np.ndarray:
    """Render to (H, W, 3) uint8 over the scene's backdrop: supersample x supersample point samples per pixel,
    box-averaged, each object covering the backdrop by its coverage (objects never overlap)."""
    n, s = cfg.image_size, cfg.supersample
    fine = (np.arange(n * s) + 0.5) / s  # sample coordinates in image pixels
    canvas = np.full((n, n, 3), 255.0 * scene.backdrop, dtype=np.float32)
    for obj in scene.objects:
        x0, y0, x1, y1 = obj.bbox
        c0, c1 = max(0, int(np.floor(x0)) - 1), min(n, int(np.ceil(x1)) + 1)  # pixel window around the object
        r0, r1 = max(0, int(np.floor(y0)) - 1), min(n, int(np.ceil(y1)) + 1)
        if c0 >= c1 or r0 >= r1:
            continue
        xs, ys = np.meshgrid(fine[c0 * s : c1 * s], fine[r0 * s : r1 * s])  # (rows*s, cols*s)
        cov = _coverage(obj, cfg, xs, ys).astype(np.float32)
        alpha = cov.reshape(r1 - r0, s, c1 - c0, s).mean(axis=(1, 3))  # (rows, cols) box downsample
        colour = np.asarray(PALETTE[obj.color], dtype=np.float32)
        canvas[r0:r1, c0:c1] += alpha[..., None] * (colour - canvas[r0:r1, c0:c1])
    return np.clip(np.round(canvas), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- the aesthetic, measured exactly


def backdrop_level(images: np.ndarray) -> np.ndarray:
    """The aesthetic read from pixels: per image, the median brightest channel of its background pixels (those under
    the parser's foreground threshold), as a fraction of the range.

    `images`: (..., H, W, 3) uint8. A render reads its scene's backdrop exactly (objects cover at most a third of a
    cell's area, anti-aliased edges are few). It is what the preference scorer learns to prefer and what its score can
    drift from: a scorer that rises while this does not has found something else to reward; a level past the world's
    range is a look no training image had.
    """
    import warnings

    from margrpo.world.parser import FOREGROUND_THRESHOLD

    value = np.asarray(images, dtype=np.float32).max(axis=-1) / 255.0  # (..., H, W)
    flat = value.reshape(*value.shape[:-2], -1)
    background = np.where(flat < FOREGROUND_THRESHOLD, flat, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an image without background: handled below
        level = np.nanmedian(background, axis=-1)
    return np.nan_to_num(level, nan=FOREGROUND_THRESHOLD)  # no background pixel at all: as bright as counts
