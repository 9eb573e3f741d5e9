"""An embedded MNIST-shaped data set: digits drawn as strokes with varied width, affine jitter and noise.

Deterministic from a seed, made with numpy in under a second (10,000 digits), no download. Images are uint8 1x28x28 with
white strokes on black, like MNIST, so the same normalisation and model apply.
"""

from __future__ import annotations

import numpy as np

SIZE = 28

# Each digit as polylines on a 0..1 box (x right, y down), like a pen would write it.
_ARC = np.linspace(0, 2 * np.pi, 17)
_GLYPHS: dict[int, list[list[tuple[float, float]]]] = {
    0: [[(0.5 + 0.32 * np.sin(t), 0.5 - 0.42 * np.cos(t)) for t in _ARC]],
    1: [[(0.32, 0.25), (0.52, 0.08), (0.52, 0.92)], [(0.35, 0.92), (0.7, 0.92)]],
    2: [[(0.2, 0.28), (0.3, 0.12), (0.5, 0.07), (0.7, 0.12), (0.78, 0.3), (0.68, 0.5), (0.2, 0.92),
         (0.82, 0.92)]],
    3: [[(0.2, 0.12), (0.75, 0.1), (0.45, 0.45), (0.72, 0.55), (0.75, 0.78), (0.55, 0.93), (0.22, 0.88)]],
    4: [[(0.65, 0.92), (0.65, 0.08), (0.15, 0.65), (0.85, 0.65)]],
    5: [[(0.78, 0.08), (0.28, 0.08), (0.24, 0.45), (0.55, 0.4), (0.76, 0.55), (0.76, 0.78), (0.55, 0.93),
         (0.2, 0.88)]],
    6: [[(0.7, 0.08), (0.4, 0.3), (0.25, 0.6), (0.3, 0.85), (0.5, 0.93), (0.72, 0.82), (0.72, 0.6),
         (0.5, 0.5), (0.28, 0.62)]],
    7: [[(0.18, 0.08), (0.82, 0.08), (0.4, 0.92)], [(0.35, 0.5), (0.7, 0.5)]],
    8: [[(0.5 + 0.22 * np.sin(t), 0.28 - 0.2 * np.cos(t)) for t in _ARC],
        [(0.5 + 0.28 * np.sin(t), 0.7 - 0.23 * np.cos(t)) for t in _ARC]],
    9: [[(0.72, 0.35), (0.5, 0.5), (0.3, 0.38), (0.32, 0.15), (0.52, 0.07), (0.72, 0.2), (0.72, 0.35),
         (0.65, 0.92)]],
}
_SEGMENTS = {digit: np.array([(a, b) for line in lines for a, b in zip(line[:-1], line[1:], strict=True)], dtype=np.float32)
             for digit, lines in _GLYPHS.items()}  # digit -> (segments, 2 ends, xy)
_MAX_SEGMENTS = max(len(s) for s in _SEGMENTS.values())


def make_digits(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images (uint8, count x 28 x 28) and labels (int64), balanced over the ten classes."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % 10).astype(np.int64)
    images = np.empty((count, SIZE, SIZE), dtype=np.uint8)
    for start in range(0, count, 512):
        chunk = labels[start:start + 512]
        images[start:start + len(chunk)] = _draw(chunk, rng)
    return images, labels


def _draw(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    segments = _padded_segments(labels)  # n, S, 2, 2 in the glyph box
    segments = segments + rng.normal(0, 0.025, segments.shape).astype(np.float32)  # a wobbly hand
    pixels = _transform(segments, rng)
    grid = np.stack(np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="xy"), -1).reshape(-1, 2)
    distance = _distance_to_segments(grid.astype(np.float32), pixels, labels)  # n, 784
    width = rng.uniform(0.9, 2.0, (len(labels), 1)).astype(np.float32)
    ink = np.clip(width + 0.5 - distance, 0, 1)
    ink *= rng.uniform(0.75, 1.0, (len(labels), 1))
    ink += rng.normal(0, 0.06, ink.shape) * (rng.random(ink.shape) < 0.3)
    return (np.clip(ink, 0, 1) * 255).round().astype(np.uint8).reshape(-1, SIZE, SIZE)


def _padded_segments(labels: np.ndarray) -> np.ndarray:
    out = np.full((len(labels), _MAX_SEGMENTS, 2, 2), np.nan, dtype=np.float32)
    for digit, segments in _SEGMENTS.items():
        out[labels == digit, :len(segments)] = segments
    return out


def _transform(segments: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random rotation, shear, scale and shift, per image, from the glyph box to pixel coordinates."""
    n = len(segments)
    angle = rng.uniform(-0.3, 0.3, n)
    shear = rng.uniform(-0.3, 0.3, n)
    scale = rng.uniform(14, 20, (n, 2)) * np.array([rng.uniform(0.75, 1.05, n), np.ones(n)]).T
    matrix = np.empty((n, 2, 2))
    matrix[:, 0, 0], matrix[:, 0, 1] = np.cos(angle), -np.sin(angle) + shear
    matrix[:, 1, 0], matrix[:, 1, 1] = np.sin(angle), np.cos(angle)
    matrix = matrix * scale[:, None, :]
    shift = 13.5 + rng.uniform(-2, 2, (n, 2))
    centred = segments - 0.5
    return (np.einsum("nij,nsej->nsei", matrix, centred) + shift[:, None, None, :]).astype(np.float32)


def _distance_to_segments(points: np.ndarray, segments: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Distance from every pixel centre to the nearest stroke segment, per image: each digit's images against
    that digit's own segments (the rest of the padded array is NaN)."""
    best = np.empty((len(segments), len(points)), dtype=np.float32)
    for digit, strokes in _SEGMENTS.items():
        chosen = labels == digit
        if chosen.any():
            best[chosen] = _nearest(points, segments[chosen, :len(strokes)])
    return best


def _nearest(points: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Distance from each point to the nearest of each image's segments (n, S, 2 ends, xy) -> (n, points)."""
    nearest = np.full((len(segments), len(points)), np.inf, dtype=np.float32)
    px, py = points[:, 0][None], points[:, 1][None]  # 1, P
    for index in range(segments.shape[1]):
        (x0, y0), (x1, y1) = (segments[:, index, end, :].T[:, :, None] for end in (0, 1))  # each n, 1
        dx, dy = x1 - x0, y1 - y0
        ax, ay = px - x0, py - y0
        t = ax * dx
        t += ay * dy
        t *= 1 / np.maximum(dx * dx + dy * dy, 1e-6)
        np.clip(t, 0, 1, out=t)
        ax -= t * dx  # from the closest point of the segment
        ay -= t * dy
        ax *= ax
        ay *= ay
        ax += ay
        np.minimum(nearest, ax, out=nearest)  # squared; one square root at the end
    return np.sqrt(nearest, out=nearest)
