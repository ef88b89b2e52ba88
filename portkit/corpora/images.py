"""Real images for an image model: the photographs matplotlib ships, or the user's own folder.

    >>> crops = images.sample_images(4, size=64)                  # matplotlib's sample photographs
    >>> corpus = images.folder_images("~/photos", size=224)       # every .jpg/.png below a folder
    >>> grey = images.folder_images("~/scans", size=28, channels=1)   # HxWx1 luminance

Every image becomes a float32 HxWxC array in [0, 1] at the model's `size` (the items of
`portkit.models.inputs.image_declaration`): the largest centred square, resized, with the model's channels
(`to_channels`: RGB, a grey image's one channel repeated; or one channel of ITU-R BT.601 luminance). A
folder is read with Pillow (matplotlib's own image reader), an unreadable file failing with its path; a
folder with more than MAX_FOLDER_IMAGES images is sampled (seeded) so that memory stays bounded.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from portkit.core.errors import BadParameter

IMAGE_TYPES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MAX_FOLDER_IMAGES = 512      # images read from a user's folder (a seeded sample of a larger one)
_SAMPLES = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")   # matplotlib's sample data
CHANNELS = (1, 3)            # what an image model takes: luminance, or red, green and blue
# Luminance from R'G'B' with the weights of ITU-R Recommendation BT.601 (Y' = 0.299 R' + 0.587 G' + 0.114 B'),
# the conversion Pillow's convert("L") documents and most greyscale image datasets were made with.
BT601_LUMA = (0.299, 0.587, 0.114)


def sample_images(n: int, size: int, seed: int = 0, channels: int = 3) -> list[np.ndarray]:
    """n real photographs, cropped at seeded random places: float32 HxWxC arrays in [0, 1] (to_channels).

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
        out.append(to_channels(_resized(img[top:top + crop, left:left + crop], size), channels))
    return out


def to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """A float32 HxWxC image with `channels` channels from an HxW or HxWxC one: a grey image (with or
    without alpha) has its channel repeated for 3; a colour one (alpha dropped) becomes BT601_LUMA
    luminance for 1."""
    if channels not in CHANNELS:
        raise BadParameter("image channels", channels, CHANNELS)
    img = np.asarray(img, dtype=np.float32)
    if img.ndim == 2:
        img = img[..., None]
    if img.ndim != 3 or img.shape[-1] not in (1, 2, 3, 4):
        raise BadParameter("image shape", tuple(img.shape), hint="give an HxW or HxWxC array, C 1 to 4")
    if img.shape[-1] == channels:
        return img
    if img.shape[-1] <= 2:                  # grey, or grey and alpha
        grey = img[..., :1]
        return grey if channels == 1 else np.repeat(grey, 3, axis=2)
    rgb = img[..., :3]
    return rgb if channels == 3 else (rgb @ np.asarray(BT601_LUMA, np.float32))[..., None]


def _walk(folder: Path):
    return (p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_TYPES and p.is_file())


def holds_images(folder: Path) -> bool:
    """Whether any image file lies below `folder` (stops at the first)."""
    return next(_walk(folder), None) is not None


def folder_images(spec: str, size: int, seed: int = 0, channels: int = 3) -> tuple[str, str, tuple[np.ndarray, ...]]:
    """The images below a user's folder (at most MAX_FOLDER_IMAGES, a seeded sample), each the largest
    centred square resized to `size`, with `channels` channels (to_channels). Returns (name, source, images)."""
    if channels not in CHANNELS:
        raise BadParameter("image channels", channels, CHANNELS)
    path = Path(spec).expanduser()
    if not path.is_dir() or not holds_images(path):
        raise BadParameter("image folder", spec, IMAGE_TYPES, hint="give a folder that holds image files")
    files = sorted(_walk(path))
    total = len(files)
    if total > MAX_FOLDER_IMAGES:
        files = sorted(random.Random(seed).sample(files, MAX_FOLDER_IMAGES))
    images = tuple(to_channels(_resized(_centre_square(_read(p)), size), channels) for p in files)
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
