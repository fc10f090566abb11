"""Per-sample transforms that run in the C++ worker threads.

Give them to the loader per column::

    from pqloader import transforms as T
    pqloader.Loader(src, transforms={
        "image": [T.DecodeImage(), T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                  T.Normalize(mean, std), T.ToCHW()],
        "features": [T.DecodeNdarray()],
        "tokens": [T.PadOrTruncate(512, pad=0)],   # adds a "tokens_length" column
    })

Each column's ops are split at the first random op: the deterministic prefix runs once
per row group in the decode task (what a cache would keep), the rest runs per sample
while a batch is assembled. Random ops draw from a counter-based generator keyed by
(seed, epoch, global sample index, op position), so a sample gets the same augmentation
whatever the thread count or resume point, and a new one every epoch. Semantics follow
torchvision's functional ops on HWC uint8 images.

Each op checks its arguments when it is made (a ``TypeError`` or ``ValueError`` naming
the op and argument, e.g. ``RandomHorizontalFlip(p=...)``); NumPy scalars are taken as
numbers. What depends on the column (its dtype and shape) is checked when the Loader is
made, naming the column.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

from pqloader._lists import _MAX_LIST_LENGTH  # (the engine's kMaxListLength, one place)
from pqloader._options import check_bool, check_int


class Op:
    """A transform op: its C++ name and parameters."""

    name: str = ""
    random: bool = False

    def __init__(self, **params: Any) -> None:
        self.params = {k: v for k, v in params.items() if v is not None}

    def _spec(self) -> tuple[str, dict[str, Any]]:
        return self.name, self.params

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and self._spec() == other._spec()


# Largest image side an op may ask for: the engine converts sizes through a double to
# int64 (10**20 was undefined behaviour, 2**62 an error only when the first row came).
_MAX_SIDE = 2**31 - 1


def _real(name: str, value: Any) -> float:
    """A finite-or-not real number (int, float or NumPy scalar), not a str or bool."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def _finite(name: str, value: Any) -> float:
    """A finite real number: NaN and infinities are refused when the op is made (they
    were refused only when the Loader was made, without naming the column or value)."""
    v = _real(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def _reals(name: str, values: Any, length: int | None = None) -> list[float]:
    # (A set has no order: (lo, hi) or a per-channel mean read in its hash order.)
    if isinstance(values, (str, bytes, set, frozenset, dict)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
    out = [_finite(name, v) for v in values]
    if length is not None and len(out) != length:
        raise ValueError(f"{name} must hold {length} numbers, got {values!r}")
    return out


def _range(name: str, values: Any) -> list[float]:
    """A (lo, hi) of finite numbers with 0 < lo <= hi (RandomResizedCrop's scale, ratio)."""
    lo, hi = _reals(name, values, 2)
    if not 0 < lo <= hi:
        raise ValueError(f"{name} must be (lo, hi) with 0 < lo <= hi, got {values!r}")
    return [lo, hi]


def _size(size: int | Sequence[int], op: str = "size") -> list[int]:
    if isinstance(size, numbers.Integral) or isinstance(size, (str, bytes)) \
            or not hasattr(size, "__iter__"):
        return [check_int(op, size, 1, _MAX_SIDE)] * 2
    if isinstance(size, (set, frozenset, dict)):  # no (height, width) order
        raise TypeError(f"{op} must be an int or (height, width), got {size!r}")
    size = [check_int(op, s, 1, _MAX_SIDE) for s in size]
    if len(size) == 1:
        return size * 2
    if len(size) != 2:
        raise ValueError(f"{op} must be an int or (height, width), got {size!r}")
    return size


class DecodeImage(Op):
    """Decode JPEG (libjpeg-turbo) or PNG (libpng) bytes to uint8 HWC.

    CMYK and YCCK JPEGs are converted to RGB (or gray) as PIL converts them.

    Args:
        mode: "rgb" (3 channels) or "gray" (1 channel, PIL's "L" weights).
        keepdims: With ``mode="gray"``, keep the channel axis: ``(H, W, 1)`` (default),
            or give ``(H, W)`` as PIL's "L" and Petastorm's codec do (False). The
            image ops after it take either.
        exif_transpose: Turn images upright by their EXIF orientation (tag 0x0112; a
            JPEG's APP1 segment, a PNG's eXIf chunk), as PIL's
            ``ImageOps.exif_transpose`` (phone photographs are often stored rotated).
            Off by default, as PIL's ``Image.open`` and torchvision's ``decode_jpeg``.
            An orientation only in XMP metadata (which Pillow also reads) is not seen.

    Large JPEGs are decoded straight to a smaller size (DCT scaling: 1/2, 1/4 or 1/8)
    when a Resize follows directly, the smallest whose shorter side still reaches 1.25x
    the Resize target.
    """

    name = "DecodeImage"

    def __init__(self, mode: str = "rgb", keepdims: bool = True, exif_transpose: bool = False) -> None:
        if not isinstance(mode, str) or mode not in ("rgb", "gray"):
            raise ValueError(f"DecodeImage(mode=...) must be 'rgb' or 'gray', got {mode!r}")
        # (np.bool_ too, as the Loader's flags take it)
        keepdims = check_bool("DecodeImage(keepdims=...)", keepdims)
        exif_transpose = check_bool("DecodeImage(exif_transpose=...)", exif_transpose)
        params: dict = {"mode": mode}
        if not keepdims:
            params["keepdims"] = 0
        if exif_transpose:
            params["exif_transpose"] = 1
        super().__init__(**params)


class Resize(Op):
    """Resize so the shorter side is `size` (bilinear, antialiased; torchvision semantics)."""

    name = "Resize"

    def __init__(self, size: int) -> None:
        super().__init__(size=check_int("Resize(size=...) (the shorter side)", size, 1, _MAX_SIDE))


class CenterCrop(Op):
    """Crop the center (height, width); pads with zeros when the image is smaller."""

    name = "CenterCrop"

    def __init__(self, size: int | Sequence[int]) -> None:
        super().__init__(size=_size(size, "CenterCrop(size=...)"))


class RandomResizedCrop(Op):
    """Crop a random area and aspect ratio, then resize to `size` (torchvision semantics).

    ``scale`` (the area's share of the image) and ``ratio`` (width / height) are
    ``(lo, hi)`` ranges of finite numbers with ``0 < lo <= hi`` (a reversed range is
    refused, where torchvision warns). As in torchvision, ``scale`` may exceed 1: the
    crops that do not fit are drawn again, then the center is taken."""

    name = "RandomResizedCrop"
    random = True

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3)) -> None:
        super().__init__(size=_size(size, "RandomResizedCrop(size=...)"),
                         scale=_range("RandomResizedCrop(scale=...)", scale),
                         ratio=_range("RandomResizedCrop(ratio=...)", ratio))


class RandomHorizontalFlip(Op):
    """Flip left-right with probability `p` (a finite number in [0, 1])."""

    name = "RandomHorizontalFlip"
    random = True

    def __init__(self, p: float = 0.5) -> None:
        prob = _finite("RandomHorizontalFlip(p=...)", p)
        if not 0 <= prob <= 1:  # (p=2 had been refused only when the Loader was made)
            raise ValueError(f"RandomHorizontalFlip(p=...) must be a probability in [0, 1], got {p!r}")
        super().__init__(p=prob)


class Normalize(Op):
    """(x - mean) / std per channel, as float32; uint8 input is first scaled to [0, 1].

    ``mean`` and ``std`` are sequences of finite numbers of one length (one per channel,
    or one for all); ``std`` holds no 0, and ``1/std`` and ``mean/std`` must fit float32."""

    name = "Normalize"

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        import numpy as np

        mean, std = _reals("Normalize(mean=...)", mean), _reals("Normalize(std=...)", std)
        if not mean or len(mean) != len(std):
            raise ValueError(f"Normalize needs mean and std of one length (one per channel, or one "
                             f"for all), got {len(mean)} means and {len(std)} stds")
        for m, s in zip(mean, std):
            if s == 0:
                raise ValueError(f"Normalize(std=...) must not hold 0, got {std!r}")
            # The engine multiplies by 1/std and adds -mean/std in float32.
            with np.errstate(over="ignore"):
                if not (np.isfinite(np.float32(1 / s)) and np.isfinite(np.float32(-m / s))):
                    raise ValueError(f"Normalize mean {m!r} and std {s!r} do not fit float32 "
                                     "(1/std and mean/std must)")
        super().__init__(mean=mean, std=std)


class ToCHW(Op):
    """Move channels first: HWC → CHW (HW → 1HW)."""

    name = "ToCHW"


# The dtypes the engine's Cast makes (cpp/src/pqloader/transform/image_ops.cc, ParseDType).
_CAST_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64")


class Cast(Op):
    """Convert values to `dtype` (a NumPy dtype or its name such as "float32"): bool,
    int8 to int64, uint8 to uint64, float16, float32 or float64 (others are refused).

    Floats to integers truncate toward zero; NaN, infinities and values out of the
    type's range give what x86-64 gives (NumPy's element-wise ``astype`` and torch agree
    but for uint32): the minimum of int32 (int8/16 and uint8/16 keep its low bits) or of
    int64, on every platform."""

    name = "Cast"

    def __init__(self, dtype: Any) -> None:
        import numpy as np

        if dtype is None:  # np.dtype(None) is float64
            raise TypeError("Cast(dtype=...) must be a NumPy dtype or its name, got None")
        try:
            name = np.dtype(dtype).name
        except (TypeError, ValueError) as e:
            raise TypeError(f"Cast(dtype=...) must be a NumPy dtype or its name, got {dtype!r} ({e})") from None
        # Refused here, naming the value, rather than as "unknown dtype" when the Loader
        # is made, without the column.
        if name not in _CAST_DTYPES:
            raise ValueError(f"Cast(dtype={dtype!r}): the engine casts to {', '.join(_CAST_DTYPES)}, "
                             f"not {name}")
        super().__init__(dtype=name)


class DecodeNdarray(Op):
    """Decode `.npy` bytes (Petastorm's NdarrayCodec layout): bool, int8 to int64, uint8
    to uint64, float16, float32 or float64 (complex, float128, datetime, string, object and
    structured dtypes are refused), C or Fortran order, either byte order, 0-d included."""

    name = "DecodeNdarray"


class DecodeCompressedNdarray(Op):
    """Decode `.npz` bytes holding one array (Petastorm's CompressedNdarrayCodec), the
    dtypes of `DecodeNdarray`; an `.npz` of several arrays is refused, and so are, as
    ``np.load`` refuses them, an array that fails its CRC-32 and an archive cut short."""

    name = "DecodeCompressedNdarray"


class PadOrTruncate(Op):
    """Make a variable-length list exactly `length` long; adds a "<column>_length" column
    with each row's valid length. It must be the column's last op: it is written
    straight into the batch (for padding to each batch's longest row instead, use
    ``Loader(lists={column: pqloader.Pad(...)})``).

    Args:
        length: The length of every row (1 to 2**40).
        pad: The value of padding elements: a number (not a bool) that the column's
            dtype holds.
        side: ``"right"`` puts padding after the values, ``"left"`` before them.
        truncation: ``"right"`` keeps a long row's first values, ``"left"`` its last.
    """

    name = "PadOrTruncate"

    def __init__(self, length: int, pad: float = 0, side: str = "right", truncation: str = "right") -> None:
        import numpy as np

        # (the engine's bound: 2**41 had been refused only when the Loader was made)
        length = check_int("PadOrTruncate(length=...)", length, 1, _MAX_LIST_LENGTH)
        # A NumPy scalar pad as a Python number, so the Loader's check that it fits the
        # column's dtype sees it (np.int64(300) in uint8 had been written as 44); a str
        # had been taken as 0, True as 1 (Pad(value=) and Pack(pad=) refuse bools).
        if isinstance(pad, (str, bytes, bool, np.bool_)) or not isinstance(pad, numbers.Real):
            raise TypeError(f"PadOrTruncate(pad=...) must be a number, got {pad!r} ({type(pad).__name__})")
        pad = pad.item() if hasattr(pad, "item") else pad
        try:
            float(pad)  # (the engine takes it as a double: 10**400 was a bare std::bad_cast)
        except OverflowError:
            raise ValueError(f"PadOrTruncate(pad=...) is beyond any column's range, got {pad!r}") from None
        for arg, v in (("side", side), ("truncation", truncation)):
            if v not in ("left", "right"):
                raise ValueError(f"PadOrTruncate({arg}=...) must be 'left' or 'right', got {v!r}")
        params: dict = {"length": length, "pad": pad}
        if side != "right":  # defaults left out, so fingerprints of existing pipelines stay
            params["side"] = side
        if truncation != "right":
            params["truncation"] = truncation
        super().__init__(**params)


__all__ = [
    "Op", "DecodeImage", "Resize", "CenterCrop", "RandomResizedCrop", "RandomHorizontalFlip",
    "Normalize", "ToCHW", "Cast", "DecodeNdarray", "DecodeCompressedNdarray", "PadOrTruncate",
]
