"""Inputs and outputs of the digits classifiers: the platform validates requests against these."""

from typing import Annotated

import msgspec

Pixel = Annotated[float, msgspec.Meta(ge=0, le=16)]


class Image(msgspec.Struct):
    """An 8x8 grey-scale digit, row by row, each pixel from 0 to 16 (scikit-learn's digits format)."""

    pixels: Annotated[list[Pixel], msgspec.Meta(min_length=64, max_length=64)]


class Prediction(msgspec.Struct):
    label: int
    confidence: float
