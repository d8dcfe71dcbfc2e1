"""What pictures are named: the extensions that make a path an image input (config's format
detection and the listing of a folder share them)."""

from __future__ import annotations

__all__ = ["IMAGE_EXTENSIONS", "looks_like_images", "looks_like_tars"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
"""What a folder's pictures are named (case aside); a glob's matches are taken whatever their names."""


def looks_like_images(path: str) -> bool:
    """Whether a path or glob names pictures by its extension (``photos/*.jpg``)."""
    return path.lower().rstrip("/").endswith(IMAGE_EXTENSIONS)


def looks_like_tars(path: str) -> bool:
    """Whether a path or glob names tar files (WebDataset shards: ``shards/*.tar``)."""
    return path.lower().rstrip("/").endswith(".tar")
