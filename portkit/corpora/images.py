"""Real images for an image model: the photographs matplotlib ships, or the user's own folder.

    >>> crops = images.sample_images(4, size=64)                  # matplotlib's sample photographs
    >>> corpus = images.folder_images("~/photos", size=224)       # every .jpg/.png below a folder

Every image becomes a float32 HxWx3 array in [0, 1] at the model's `size` (the items of
`portkit.models.inputs.image_declaration`): the largest centred square, resized. A folder is read with
Pillow (matplotlib's own image reader), an unreadable file failing with its path; a folder with
more than MAX_FOLDER_IMAGES images is sampled (seeded) so that memory stays bounded.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from portkit.core.errors import BadParameter

IMAGE_TYPES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MAX_FOLDER_IMAGES = 512      # images read from a user's folder (a seeded sample of a larger one)
_SAMPLES = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")   # matplotlib's sample data


def sample_images(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """n real photographs, cropped at seeded random places: float32 HxWx3 arrays in [0, 1].

    The pixels come from the sample images that matplotlib ships (a portrait and a product
    photo), so a vision model sees natural image statistics with no download."""
    import matplotlib.image as mpimg
    from matplotlib import cbook

    sources = []
    for name in _SAMPLES:
        with cbook.get_sample_data(name) as handle:
            sources.append(_unit_rgb(mpimg.imread(handle, format=name.rsplit(".", 1)[1])))
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = sources[i % len(sources)]
        h, w = img.shape[:2]
        crop = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        top, left = int(rng.integers(0, h - crop + 1)), int(rng.integers(0, w - crop + 1))
        out.append(_resized(img[top:top + crop, left:left + crop], size))
    return out


def _walk(folder: Path):
    return (p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_TYPES and p.is_file())


def holds_images(folder: Path) -> bool:
    """Whether any image file lies below `folder` (stops at the first)."""
    return next(_walk(folder), None) is not None


def folder_images(spec: str, size: int, seed: int = 0) -> tuple[str, str, tuple[np.ndarray, ...]]:
    """The images below a user's folder (at most MAX_FOLDER_IMAGES, a seeded sample), each the largest
    centred square resized to `size`. Returns (name, source, images)."""
    path = Path(spec).expanduser()
    if not path.is_dir() or not holds_images(path):
        raise BadParameter("image folder", spec, IMAGE_TYPES, hint="give a folder that holds image files")
    files = sorted(_walk(path))
    total = len(files)
    if total > MAX_FOLDER_IMAGES:
        files = sorted(random.Random(seed).sample(files, MAX_FOLDER_IMAGES))
    images = tuple(_resized(_centre_square(_read(p)), size) for p in files)
    sampled = f" (a seeded sample of {len(files)})" if total > len(files) else ""
    return path.name, f"{total} images in {path.resolve()}{sampled}", images


def check_folder(spec: str) -> None:
    """Every image file below a folder opens as an image (its header read, no pixels decoded)."""
    from PIL import Image, UnidentifiedImageError
    path = Path(spec).expanduser()
    if not path.is_dir() or not holds_images(path):
        raise BadParameter("image folder", spec, IMAGE_TYPES, hint="give a folder that holds image files")
    for file in _walk(path):
        try:
            with Image.open(file):
                pass
        except (OSError, UnidentifiedImageError) as exc:
            raise BadParameter("image", str(file), hint=f"cannot be read as an image ({exc})") from None


def _read(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as img:
            return _unit_rgb(np.asarray(img.convert("RGB")))
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise BadParameter("image", str(path), hint=f"cannot be read as an image ({exc})") from None


def _unit_rgb(img: np.ndarray) -> np.ndarray:
    """float32 RGB in [0, 1] from 8-bit or float pixels, grey or with alpha."""
    img = img.astype(np.float32)
    if img.max() > 1.0:
        img = img / 255.0
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return img[..., :3]


def _centre_square(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return img[top:top + side, left:left + side]


def _resized(square: np.ndarray, size: int) -> np.ndarray:
    """A square image resized to size x size (nearest neighbour, as a data loader's plainest resize)."""
    index = (np.arange(size) * square.shape[0] / size).astype(int)
    return np.ascontiguousarray(square[index][:, index])
