"""Models the benchmarks run through bulkinfer: ``Nothing`` answers each picture with its
height, so a figure measures reading and decoding, not a model."""

from __future__ import annotations

from bulkinfer import ImageAdapter


class Nothing(ImageAdapter):
    def prepare(self, image):  # type: ignore[no-untyped-def]
        return image.shape[0]

    def predict(self, batch):  # type: ignore[no-untyped-def]
        return {"height": batch}
