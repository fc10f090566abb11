"""C++ transforms: decoding, geometry and augmentation against reference implementations.

References: PIL for decoding (PNG exactly, JPEG within a tolerance), and torch's
antialiased bilinear interpolation for resizing (what torchvision.transforms.v2.functional
.resize calls for tensors; torchvision's own wheel here is built for CUDA and cannot load
with the CPU torch, so the tests call torch directly and mirror torchvision's crop logic).
Images are real photographs shipped with scikit-image.
"""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _core
from pqloader import transforms as T

Image = pytest.importorskip("PIL.Image")
skdata = pytest.importorskip("skimage.data")
torch = pytest.importorskip("torch")

# Documented tolerances (docs/design.md, "Transforms").
JPEG_MAX_DIFF = 2        # vs PIL's decode, per pixel value
RESIZE_MAX_DIFF = 1      # vs torch's antialiased bilinear, rounded to uint8
DCT_MEAN_DIFF = 1.5      # DCT-scaled decode + Resize vs full decode + Resize (mean |diff|)


def photos() -> dict[str, np.ndarray]:
    return {"astronaut": skdata.astronaut(), "chelsea": skdata.chelsea(), "coffee": skdata.coffee(),
            "rocket": skdata.rocket(), "camera": skdata.camera()}


def encode(a: np.ndarray, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, format=fmt, **kw)
    return b.getvalue()


def apply(ops, data: bytes, seed=0, epoch=0, sample=0) -> np.ndarray:
    return _core._apply_ops([op._spec() for op in ops], data, seed, epoch, sample)


def torch_resize(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """torchvision v2 functional resize of a uint8 HWC image (antialias=True)."""
    t = torch.from_numpy(np.array(a, dtype=np.float32)).permute(2, 0, 1)[None]
    r = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return r.round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).numpy()


def torchvision_center_crop(a: np.ndarray, th: int, tw: int) -> np.ndarray:
    """torchvision.transforms.v2.functional.center_crop on HWC (pads with zeros)."""
    h, w = a.shape[:2]
    if th > h or tw > w:
        pl, pt = (tw - w) // 2 if tw > w else 0, (th - h) // 2 if th > h else 0
        pr, pb = (tw - w + 1) // 2 if tw > w else 0, (th - h + 1) // 2 if th > h else 0
        a = np.pad(a, ((pt, pb), (pl, pr), (0, 0)))
        h, w = a.shape[:2]
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return a[top:top + th, left:left + tw]


# -- decoding -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "rocket", "camera"])
def test_png_decode_equals_pil_exactly(name):
    img = photos()[name]
    data = encode(img, "PNG")
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(apply([T.DecodeImage()], data), ref)
    gray = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    np.testing.assert_array_equal(apply([T.DecodeImage("gray")], data)[..., 0], gray)


@pytest.mark.parametrize("mode", ["P", "RGBA", "LA", "I;16"])
def test_png_variants_decode_like_pil(mode):
    img = Image.fromarray(skdata.chelsea())
    if mode == "I;16":
        variant = Image.fromarray((np.asarray(img.convert("L")).astype(np.uint16) * 257))
    elif mode == "RGBA":
        rgba = np.dstack([np.asarray(img), np.linspace(0, 255, img.size[0] * img.size[1]).astype(np.uint8).reshape(img.size[1], img.size[0])])
        variant = Image.fromarray(rgba, "RGBA")
    else:
        variant = img.convert(mode)
    data = encode(np.asarray(variant) if mode != "P" else np.asarray(img), "PNG") if mode != "P" else None
    if mode == "P":
        b = io.BytesIO()
        variant.save(b, format="PNG")
        data = b.getvalue()
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    got = apply([T.DecodeImage()], data)
    if mode == "I;16":
        # PIL maps 16-bit gray to 8 bits by the high byte too, via mode "I": compare to that.
        ref16 = np.asarray(Image.open(io.BytesIO(data)))
        np.testing.assert_array_equal(got[..., 0], (ref16 >> 8).astype(np.uint8))
    else:
        np.testing.assert_array_equal(got, ref)


def strip_segments(data: bytes, marker: int) -> bytes:
    """`data` (a JPEG) without its header segments of `marker` (0xC4 DHT, 0xDB DQT)."""
    out, i = bytearray(data[:2]), 2
    while data[i + 1] != 0xDA:
        n = int.from_bytes(data[i + 2:i + 4], "big")
        if data[i + 1] != marker:
            out += data[i:i + 2 + n]
        i += 2 + n
    return bytes(out + data[i:])


def test_a_jpeg_without_tables_does_not_take_those_of_the_jpeg_decoded_before():
    # A Motion-JPEG frame has no DHT: the standard tables (PIL's default ones) are
    # implied. libjpeg keeps tables across images, so a reused decompressor gave the
    # frame the previous image's (optimized) tables: pixels that depended on which image
    # the thread decoded before. `apply` runs on this thread, so the calls share it.
    frame = strip_segments(encode(skdata.chelsea(), "JPEG", quality=90), 0xC4)
    pil = np.asarray(Image.open(io.BytesIO(frame)).convert("RGB"))
    np.testing.assert_array_equal(apply([T.DecodeImage()], frame), pil)
    apply([T.DecodeImage()], encode(skdata.astronaut(), "JPEG", quality=90, optimize=True))
    np.testing.assert_array_equal(apply([T.DecodeImage()], frame), pil)
    no_dqt = strip_segments(encode(skdata.chelsea(), "JPEG", quality=90), 0xDB)
    apply([T.DecodeImage()], encode(skdata.astronaut(), "JPEG", quality=90))
    with pytest.raises(pqloader.InvalidDataError, match="Quantization table"):
        apply([T.DecodeImage()], no_dqt)


@pytest.mark.parametrize("cut", [12, 2])
def test_a_png_cut_after_its_image_data_decodes_as_pil_decodes_it(cut):
    # IEND (12 bytes) missing or cut short: every pixel is there, and PIL decodes it.
    data = encode(skdata.chelsea(), "PNG")[:-cut]
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(apply([T.DecodeImage()], data), ref)


@pytest.mark.parametrize("cut", [13, 14, 16])
def test_a_png_cut_in_its_last_idat_crc_decodes_as_pil_decodes_it(cut):
    # A download short by 13-16 bytes ends inside the last IDAT chunk's CRC, after every
    # pixel: libpng fails while finishing the last row (it reads that CRC), before
    # png_read_image returns, so it was refused; PIL decodes the whole image.
    full = encode(skdata.chelsea(), "PNG")
    data = full[:-cut]
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(ref, np.asarray(Image.open(io.BytesIO(full)).convert("RGB")))
    np.testing.assert_array_equal(apply([T.DecodeImage()], data), ref)


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "camera"])
@pytest.mark.parametrize("quality", [75, 90])
def test_jpeg_decode_matches_pil_within_tolerance(name, quality):
    img = photos()[name]
    data = encode(img, "JPEG", quality=quality)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    got = apply([T.DecodeImage()], data).astype(int)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF


@pytest.mark.parametrize("subsampling", [0, 2])  # 4:4:4 and 4:2:0 (Pillow's default)
@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_gray_decode_of_a_colour_jpeg_matches_pil_within_tolerance(name, subsampling):
    # TurboJPEG's own gray output (the stored luma) was up to 13-28 off PIL's convert("L")
    # on 4:2:0 files: colour files are decoded to RGB and converted with PIL's weights.
    data = encode(photos()[name], "JPEG", quality=90, subsampling=subsampling)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("L")).astype(int)
    got = apply([T.DecodeImage("gray")], data)[..., 0].astype(int)
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF
    gray_file = encode(photos()["camera"], "JPEG", quality=90)  # a grayscale JPEG: as stored
    assert np.abs(apply([T.DecodeImage("gray")], gray_file)[..., 0].astype(int) -
                  np.asarray(Image.open(io.BytesIO(gray_file))).astype(int)).max() <= JPEG_MAX_DIFF


def test_a_jpeg_with_stray_bytes_between_header_markers_decodes_as_pil():
    # libjpeg warns ("extraneous bytes before marker"); PIL decodes it. Refused before.
    data = encode(photos()["chelsea"], "JPEG", quality=90)
    app0_end = 4 + ((data[4] << 8) | data[5])  # SOI, then APP0's marker and length
    assert data[2:4] == b"\xff\xe0"
    junk = data[:app0_end] + b"\x00\x01\x02\x03" + data[app0_end:]
    ref = np.asarray(Image.open(io.BytesIO(junk)).convert("RGB")).astype(int)
    assert np.abs(apply([T.DecodeImage()], junk).astype(int) - ref).max() <= JPEG_MAX_DIFF


@pytest.mark.parametrize("progressive", [False, True])
def test_a_truncated_jpeg_is_refused_also_after_a_harmless_warning(progressive):
    # TurboJPEG keeps libjpeg's first warning only: stray bytes between header markers
    # warn first, and the premature end that follows went unseen: the missing part was
    # decoded as gray 128 (PIL: "image file is truncated").
    data = encode(photos()["chelsea"], "JPEG", quality=90, progressive=progressive)
    app0_end = 4 + ((data[4] << 8) | data[5])
    bad = data[:app0_end] + b"\x00\x01\x02\x03" + data[app0_end:]
    ref = np.asarray(Image.open(io.BytesIO(bad)).convert("RGB")).astype(int)
    assert np.abs(apply([T.DecodeImage()], bad).astype(int) - ref).max() <= JPEG_MAX_DIFF
    for cut in (bad[:len(bad) * 2 // 3], bad[:-2]):  # (a missing EOI alone is refused too)
        with pytest.raises(OSError, match="truncated"):
            Image.open(io.BytesIO(cut)).convert("RGB")
        with pytest.raises(pqloader.InvalidDataError, match="Premature end"):
            apply([T.DecodeImage()], cut)


def test_a_progressive_jpeg_of_thousands_of_scans_is_refused():
    # Each repeated scan costs a pass over the whole image: 2,000 scans of a 57 KB file
    # took 5-10 s. libjpeg-turbo's scan limit (500) refuses it at once.
    data = encode(np.full((256, 256, 3), 128, np.uint8), "JPEG", quality=75, progressive=True)
    last_sos = data.rfind(b"\xff\xda")
    bomb = data[:-2] + data[last_sos:-2] * 600 + data[-2:]  # the last scan again and again
    with pytest.raises(Exception, match="scans"):
        apply([T.DecodeImage()], bomb)
    apply([T.DecodeImage()], data)  # the file itself decodes


def dct_scaled_and_full(data: bytes, target: int, exif_transpose: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(DecodeImage + Resize(target) as the loader plans it, with DCT scaling; the same
    decoded at full size)."""
    decode = {"mode": "rgb", "min_short_side": target, **({"exif_transpose": 1} if exif_transpose else {})}
    scaled = _core._apply_ops([("DecodeImage", decode), ("Resize", {"size": target})], data, 0, 0, 0)
    return scaled, apply([T.DecodeImage(exif_transpose=exif_transpose), T.Resize(target)], data)


def ycck_jpeg(cmyk: np.ndarray, quality: int = 90) -> bytes:
    """A YCCK JPEG of the (inverted, as Adobe's) CMYK pixels `cmyk`, written by
    libjpeg-turbo's TurboJPEG API (it compresses CMYK input as YCCK; PIL cannot)."""
    import ctypes
    import ctypes.util

    tj = ctypes.CDLL(ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0")
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = tj.tjInitCompress()
    out, size = ctypes.POINTER(ctypes.c_ubyte)(), ctypes.c_ulong(0)
    src = np.ascontiguousarray(cmyk)
    h, w = src.shape[:2]
    TJPF_CMYK, TJSAMP_420 = 11, 2
    try:
        rc = tj.tjCompress2(ctypes.c_void_p(handle), src.ctypes.data_as(ctypes.c_void_p), w, 0, h, TJPF_CMYK,
                            ctypes.byref(out), ctypes.byref(size), TJSAMP_420, quality, 0)
        assert rc == 0
        return ctypes.string_at(out, size.value)
    finally:
        tj.tjFree(out)
        tj.tjDestroy(ctypes.c_void_p(handle))


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "camera"])
@pytest.mark.parametrize("kind", ["cmyk", "ycck"])
def test_cmyk_and_ycck_jpegs_decode_like_pil_within_tolerance(name, kind):
    # Prepress photographs are stored as CMYK or YCCK JPEGs in Adobe's inverted
    # convention (~20 of ImageNet's files): decoded to RGB (or gray) as PIL converts them.
    photo = Image.fromarray(photos()[name]).convert("RGB")
    if kind == "cmyk":
        b = io.BytesIO()
        photo.convert("CMYK").save(b, format="JPEG", quality=90)
        data = b.getvalue()
    else:
        data = ycck_jpeg(255 - np.asarray(photo.convert("CMYK")))  # as stored: 255 - ink
    pil = Image.open(io.BytesIO(data))
    assert pil.mode == "CMYK" and pil.info["adobe_transform"] == (0 if kind == "cmyk" else 2)
    ref = np.asarray(pil.convert("RGB")).astype(int)
    got = apply([T.DecodeImage()], data).astype(int)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF
    gray = apply([T.DecodeImage("gray")], data)
    assert gray.shape == (*ref.shape[:2], 1)
    assert np.abs(gray[..., 0].astype(int) - np.asarray(pil.convert("L"))).max() <= JPEG_MAX_DIFF
    # And near the photograph itself (PIL's RGB -> CMYK -> RGB is lossless; what is left
    # is JPEG's loss on four channels, ~2; an uninverted conversion is off by ~100).
    assert np.abs(got - np.asarray(photo)).mean() < 4.0
    # DCT-scaled when a Resize follows, as RGB JPEGs are.
    scaled, full = dct_scaled_and_full(data, 128)
    assert scaled.shape == full.shape and np.abs(scaled.astype(int) - full.astype(int)).mean() < DCT_MEAN_DIFF



@pytest.mark.parametrize("subsampling", ["4:2:2", "4:2:0"])
def test_cmyk_jpeg_with_a_subsampled_first_component_decodes_like_pil(subsampling):
    # Pillow writes CMYK with subsampling= as C 2x1 or 2x2, M Y K 1x1: TurboJPEG 2.x's
    # tjDecompressHeader3 has no TJSAMP for that and fails ("Could not determine
    # subsampling type"), though it has read the size and colour space and tjDecompress2
    # decodes the file; it was refused as a "corrupt JPEG header" (skipped under
    # on_decode_error="skip"), where PIL decodes it.
    b = io.BytesIO()
    Image.fromarray(photos()["coffee"]).convert("CMYK").save(b, format="JPEG", quality=90,
                                                               subsampling=subsampling)
    data = b.getvalue()
    pil = Image.open(io.BytesIO(data))
    ref = np.asarray(pil.convert("RGB")).astype(int)
    got = apply([T.DecodeImage()], data).astype(int)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF
    gray = apply([T.DecodeImage("gray")], data)
    assert np.abs(gray[..., 0].astype(int) - np.asarray(pil.convert("L"))).max() <= JPEG_MAX_DIFF
    scaled, full = dct_scaled_and_full(data, 128)
    assert scaled.shape == full.shape and np.abs(scaled.astype(int) - full.astype(int)).mean() < DCT_MEAN_DIFF


def exif_jpeg(photo, orientation: int, quality: int = 90) -> bytes:
    """`photo` as a JPEG whose EXIF says `orientation` (written by PIL)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    b = io.BytesIO()
    photo.save(b, format="JPEG", quality=quality, exif=exif)
    return b.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_transpose_turns_jpegs_upright_as_pil(orientation):
    from PIL import ImageOps

    photo = Image.fromarray(photos()["chelsea"]).convert("RGB")  # 451 x 300: not square
    data = exif_jpeg(photo, orientation)
    pil = Image.open(io.BytesIO(data))
    assert pil.getexif()[0x0112] == orientation
    ref = np.asarray(ImageOps.exif_transpose(pil).convert("RGB")).astype(int)
    got = apply([T.DecodeImage(exif_transpose=True)], data).astype(int)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF
    gray = apply([T.DecodeImage("gray", keepdims=False, exif_transpose=True)], data)
    assert gray.shape == ref.shape[:2]
    # Off by default: the stored orientation, as PIL's Image.open.
    stored = apply([T.DecodeImage()], data)
    assert stored.shape == np.asarray(pil).shape
    # Before a Resize, DCT-scaled (an image to be turned only by a factor dividing both
    # sides: 901x601 is not, 896x592 at 1/2) and turned: within tolerance of turning the
    # full decode.
    for image in (photo.resize((901, 601), Image.BICUBIC), photo.resize((896, 592), Image.BICUBIC)):
        data = exif_jpeg(image, orientation)
        scaled, full = dct_scaled_and_full(data, 128, exif_transpose=True)
        assert scaled.shape == full.shape
        diff = np.abs(scaled.astype(int) - full.astype(int)).mean()
        scaled_decode = image.size == (896, 592) or orientation == 1
        assert (diff > 0) == scaled_decode and diff < DCT_MEAN_DIFF, (image.size, diff)


def test_exif_orientation_after_stray_bytes_between_markers_is_read_as_pil():
    # Stray bytes before the APP1 segment: libjpeg and PIL skip them (the image decodes,
    # with a warning); the EXIF reader stopped at them, so the image stayed as stored.
    from PIL import ImageOps

    photo = Image.fromarray(photos()["chelsea"]).convert("RGB")
    data = exif_jpeg(photo, 6)
    app0_end = 4 + ((data[4] << 8) | data[5])
    assert data[2:4] == b"\xff\xe0" and data[app0_end:app0_end + 2] == b"\xff\xe1"
    junk = data[:app0_end] + b"\x00\x01\x02\x03" + data[app0_end:]
    ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(junk))).convert("RGB")).astype(int)
    got = apply([T.DecodeImage(exif_transpose=True)], junk).astype(int)
    assert got.shape == ref.shape == (451, 300, 3)
    assert np.abs(got - ref).max() <= JPEG_MAX_DIFF


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_transpose_turns_pngs_upright_exactly_as_pil(orientation):
    from PIL import ImageOps

    photo = Image.fromarray(photos()["chelsea"]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    b = io.BytesIO()
    photo.save(b, format="PNG", exif=exif)  # an eXIf chunk, before the image data
    before = b.getvalue()
    # The same chunk moved after the image data (just before IEND), as some writers put it.
    start = before.index(b"eXIf") - 4
    end = start + 12 + int.from_bytes(before[start:start + 4], "big")
    rest = before[:start] + before[end:]
    iend = rest.index(b"IEND") - 4
    after = rest[:iend] + before[start:end] + rest[iend:]
    assert after.index(b"eXIf") > after.index(b"IDAT")
    for data in (before, after):
        ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
        np.testing.assert_array_equal(apply([T.DecodeImage(exif_transpose=True)], data), ref)
        gray = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("L"))
        np.testing.assert_array_equal(apply([T.DecodeImage("gray", keepdims=False, exif_transpose=True)], data),
                                      gray)
        np.testing.assert_array_equal(apply([T.DecodeImage()], data), np.asarray(photo))


def test_exif_orientation_that_cannot_be_read_leaves_the_image_as_stored():
    # Untrusted bytes: an EXIF segment cut short, an IFD offset past its end, an
    # orientation out of range or of the wrong type are ignored (orientation 1).
    photo = Image.fromarray(photos()["chelsea"]).convert("RGB")
    good = exif_jpeg(photo, 6)
    at = good.index(b"Exif\0\0")
    tiff = at + 6
    little = good[tiff:tiff + 2] == b"II"
    order = "little" if little else "big"
    ifd = tiff + int.from_bytes(good[tiff + 4:tiff + 8], order)
    entry = ifd + 2  # PIL writes the orientation as IFD0's only entry
    assert int.from_bytes(good[entry:entry + 2], order) == 0x0112
    variants = {
        "offset past the segment": good[:tiff + 4] + (60000).to_bytes(4, order) + good[tiff + 8:],
        "orientation 9": good[:entry + 8] + (9).to_bytes(2, order) + good[entry + 10:],
        "type LONG": good[:entry + 2] + (4).to_bytes(2, order) + good[entry + 4:],
        "bad byte order": good[:tiff] + b"XX" + good[tiff + 2:],
    }
    stored = apply([T.DecodeImage()], good)
    for name, data in variants.items():
        assert len(data) == len(good), name
        np.testing.assert_array_equal(apply([T.DecodeImage(exif_transpose=True)], data), stored, err_msg=name)
    assert apply([T.DecodeImage(exif_transpose=True)], good).shape == stored.shape[1::-1] + (3,)


def test_large_jpeg_is_dct_scaled_before_resize_within_tolerance():
    big = np.asarray(Image.fromarray(skdata.astronaut()).resize((2048, 1536), Image.BICUBIC))
    data = encode(big, "JPEG", quality=90)
    full = torch_resize(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), 256, 341)
    # Through the loader, DecodeImage followed by Resize decodes at reduced size.
    scaled = _core._apply_ops([("DecodeImage", {"mode": "rgb", "min_short_side": 512}), ("Resize", {"size": 256})],
                              data, 0, 0, 0)
    assert scaled.shape == full.shape == (256, 341, 3)
    diff = np.abs(scaled.astype(int) - full.astype(int))
    assert diff.mean() < DCT_MEAN_DIFF
    unscaled = apply([T.DecodeImage(), T.Resize(256)], data)
    assert np.abs(unscaled.astype(int) - full.astype(int)).max() <= RESIZE_MAX_DIFF


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "rocket"])
@pytest.mark.parametrize("size", [(500, 375), (1024, 768), (1000, 750), (1601, 1201)])
def test_jpegs_decode_scaled_to_the_resize_target_within_tolerance(name, size, tmp_path):
    # The loader decodes at the smallest DCT scale (1/2, 1/4, 1/8) whose shorter side
    # reaches 1.25x the Resize target (1000x750 -> 1/2 for 256; 500x375 is not scaled); the
    # output shape must not change (the scaled size is rounded up) and the pixels stay
    # within the documented tolerance.
    img = np.asarray(Image.fromarray(photos()[name]).resize(size, Image.BICUBIC))
    data = encode(img, "JPEG", quality=90)
    scaled, full = dct_scaled_and_full(data, 256)
    assert scaled.shape == full.shape
    assert np.abs(scaled.astype(int) - full.astype(int)).mean() < DCT_MEAN_DIFF
    # And that is what the loader does with DecodeImage followed by Resize.
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"image": pa.array([data], pa.binary())}), path)
    batch = next(iter(pqloader.Loader(str(path), transforms={"image": [T.DecodeImage(), T.Resize(256)]})))
    np.testing.assert_array_equal(batch["image"][0], scaled)


@pytest.mark.parametrize("name", ["astronaut", "coffee", "rocket"])
def test_dct_scaling_stays_within_tolerance_over_sizes_and_targets(name):
    # Every scale the margin allows, on photographs at several sizes and small to usual
    # targets (astronaut, the most detailed, is the worst case: mean 1.36 at 96 px).
    base = Image.fromarray(photos()[name]).convert("RGB")
    worst = 0.0
    for factor in (1, 2, 3):
        img = base.resize((base.width * factor, base.height * factor), Image.BICUBIC)
        data = encode(np.asarray(img), "JPEG", quality=90)
        for target in (96, 128, 200, 256):
            if target < min(img.size):
                scaled, full = dct_scaled_and_full(data, target)
                assert scaled.shape == full.shape
                worst = max(worst, np.abs(scaled.astype(int) - full.astype(int)).mean())
    assert worst < DCT_MEAN_DIFF


def test_dct_scaling_keeps_a_margin_above_the_resize_target():
    # 600x400 -> Resize(200): 1/2 would give 300x200, the target itself (the decoder's
    # low-pass alone, mean |diff| 2.3 from a full decode + Resize): decoded at full size.
    # 1200x800 -> Resize(200): 1/2 gives 400 >= 1.25 x 200: scaled.
    coffee = Image.fromarray(skdata.coffee()).convert("RGB")
    assert coffee.size == (600, 400)
    scaled, full = dct_scaled_and_full(encode(np.asarray(coffee), "JPEG", quality=90), 200)
    np.testing.assert_array_equal(scaled, full)
    big = coffee.resize((1200, 800), Image.BICUBIC)
    scaled, full = dct_scaled_and_full(encode(np.asarray(big), "JPEG", quality=90), 200)
    assert scaled.shape == full.shape and not np.array_equal(scaled, full)


# -- geometry -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "rocket"])
@pytest.mark.parametrize("size", [64, 223, 300, 700])
def test_resize_matches_torchvision_within_one(name, size):
    img = photos()[name]
    if img.ndim == 2:
        img = np.dstack([img] * 3)
    data = encode(img, "PNG")
    got = apply([T.DecodeImage(), T.Resize(size)], data)
    h, w = img.shape[:2]
    eh, ew = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    assert got.shape == (eh, ew, 3)
    assert np.abs(got.astype(int) - torch_resize(img, eh, ew).astype(int)).max() <= RESIZE_MAX_DIFF


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "rocket"])
@pytest.mark.parametrize("size", [32, 223, 256, 900])
def test_resize_equals_pil_bilinear_exactly(name, size):
    img = photos()[name]
    got = apply([T.DecodeImage(), T.Resize(size)], encode(img, "PNG"))
    ref = np.asarray(Image.fromarray(img).resize((got.shape[1], got.shape[0]), Image.BILINEAR))
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("size", [(100, 100), (224, 300), (401, 10), (600, 700), (299, 450)])
def test_center_crop_equals_torchvision_exactly(size):
    img = skdata.chelsea()  # 300 x 451
    got = apply([T.DecodeImage(), T.CenterCrop(size)], encode(img, "PNG"))
    np.testing.assert_array_equal(got, torchvision_center_crop(img, *size))


@pytest.mark.parametrize("extra", [(1, 1), (1, 0), (2, 2)])
def test_resize_then_a_center_crop_a_pixel_larger_pads_as_torchvision(extra):
    # Fused, a crop one row or column larger than the resized image was refused ("resize
    # window outside the resized image"; CenterBox's offset of a 1-pixel pad is 0).
    img = photos()["chelsea"]  # 300 x 451
    data = encode(img, "PNG")
    resized = apply([T.DecodeImage(), T.Resize(32)], data)
    th, tw = resized.shape[0] + extra[0], resized.shape[1] + extra[1]
    got = apply([T.DecodeImage(), T.Resize(32), T.CenterCrop((th, tw))], data)
    np.testing.assert_array_equal(got, torchvision_center_crop(resized, th, tw))


def test_normalize_then_to_chw_of_a_two_dimensional_image_is_1hw():
    # The fused Normalize + ToCHW kept a 2-D gray image HW (and said so in its
    # signature); ToCHW alone makes it 1HW.
    data = encode(photos()["camera"], "PNG")
    ops = [T.DecodeImage("gray", keepdims=False), T.Normalize([0.5], [0.25])]
    plain = apply(ops, data)
    got = apply([*ops, T.ToCHW()], data)
    assert plain.ndim == 2 and got.shape == (1, *plain.shape)
    np.testing.assert_array_equal(got[0], plain)


@pytest.mark.parametrize("op, param, bad", [
    (lambda: T.RandomHorizontalFlip(), "p", float("nan")),
    (lambda: T.RandomResizedCrop(8), "scale", [float("nan"), 1.0]),
    (lambda: T.RandomResizedCrop(8), "ratio", [0.5, float("inf")]),
    (lambda: T.Normalize([0.5] * 3, [1.0] * 3), "std", [1.0, float("nan"), 1.0]),
    (lambda: T.Normalize([0.5] * 3, [1.0] * 3), "mean", [float("nan")] * 3)])
def test_nan_parameters_are_refused_when_the_op_and_the_loader_are_made(tmp_path, op, param, bad):
    # NaN failed every comparison, so `p < 0 || p > 1` let it through: a flip that never
    # flipped, a crop that always fell back to the center, NaN pixels. The op refuses it
    # (naming the argument); the engine too, where the op's parameters are set past it.
    with pytest.raises(ValueError, match=rf"{param}=...\) must be a finite number"):
        type(op())(**{**op().params, param: bad})
    made = op()
    made.params[param] = bad
    pq.write_table(pa.table({"image": [encode(photos()["camera"], "PNG")]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match="needs|must be finite"):
        pqloader.Loader(str(tmp_path), transforms={"image": [T.DecodeImage(), made]})


def test_random_resized_crop_equals_crop_then_resize_with_its_parameters():
    img = skdata.coffee()
    data = encode(img, "PNG")
    for sample in range(20):
        top, left, h, w = _core._random_resized_crop_params(11, 2, sample, 1, img.shape[0], img.shape[1],
                                                             [0.08, 1.0], [3 / 4, 4 / 3])
        got = apply([T.DecodeImage(), T.RandomResizedCrop(96)], data, seed=11, epoch=2, sample=sample)
        ref = torch_resize(img[top:top + h, left:left + w], 96, 96)
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= RESIZE_MAX_DIFF


def test_random_resized_crop_parameters_respect_scale_and_ratio():
    H, W = 375, 500
    areas, ratios = [], []
    for sample in range(2000):
        top, left, h, w = _core._random_resized_crop_params(5, 0, sample, 0, H, W, [0.08, 1.0], [3 / 4, 4 / 3])
        assert 0 <= top and top + h <= H and 0 <= left and left + w <= W
        areas.append(h * w / (H * W))
        ratios.append(w / h)
    areas, ratios = np.array(areas), np.array(ratios)
    # Rounding to whole pixels moves the bounds slightly.
    assert areas.min() >= 0.07 and areas.max() <= 1.0
    assert ratios.min() >= 0.74 and ratios.max() <= 1.34
    # Same distribution as torchvision's get_params (re-implemented with NumPy draws).
    rng = np.random.default_rng(0)
    ref = []
    for _ in range(20000):
        for _attempt in range(10):
            target = H * W * rng.uniform(0.08, 1.0)
            aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= W and 0 < h <= H:
                ref.append(h * w / (H * W))
                break
    assert abs(areas.mean() - np.mean(ref)) < 0.02
    assert abs(np.median(areas) - np.median(ref)) < 0.03
    # An impossible ratio range falls back to torchvision's central crop.
    top, left, h, w = _core._random_resized_crop_params(5, 0, 0, 0, 100, 400, [0.9, 1.0], [0.1, 0.2])
    assert (h, w) == (100, 20) and (top, left) == (0, 190)


@pytest.mark.parametrize("cache", [False, True])
def test_cast_on_one_of_several_number_columns_of_a_shuffled_loader(tmp_path, cache):
    # A shuffled loader keeps a unit's small number columns in one row-major block; a
    # column cast per sample was read from its own (moved) buffer: a segfault.
    rng = np.random.default_rng(3)
    n = 2000
    table = pa.table({"id": np.arange(n), "f": rng.standard_normal(n).astype(np.float32),
                      "d": rng.standard_normal(n), "k": rng.integers(0, 9, n, dtype=np.int32)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    loader = pqloader.Loader(tmp_path / "t.parquet", batch_size=128, shuffle=True, seed=4, num_workers=2,
                             transforms={"d": [T.Cast("float32")]},
                             cache_dir=tmp_path / "cache" if cache else None, num_epochs=2)
    batches = list(loader)
    got = {k: np.concatenate([b[k] for b in batches]) for k in ("id", "f", "d", "k")}
    assert sorted(got["id"]) == sorted(list(range(n)) * 2)
    assert got["d"].dtype == np.float32
    np.testing.assert_array_equal(got["d"], table["d"].to_numpy()[got["id"]].astype(np.float32))
    np.testing.assert_array_equal(got["f"], table["f"].to_numpy()[got["id"]])
    np.testing.assert_array_equal(got["k"], table["k"].to_numpy()[got["id"]])


def test_flip_normalize_and_to_chw_match_numpy():
    img = skdata.astronaut()
    data = encode(img, "PNG")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    got = apply([T.DecodeImage(), T.Normalize(mean, std), T.ToCHW()], data)
    ref = ((img.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
    assert got.dtype == np.float32 and got.shape == (3, 512, 512)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    flips = [apply([T.DecodeImage(), T.RandomHorizontalFlip(p=0.5)], data, seed=1, sample=s) for s in range(16)]
    flipped = [np.array_equal(f, img[:, ::-1]) for f in flips]
    unflipped = [np.array_equal(f, img) for f in flips]
    assert all(a or b for a, b in zip(flipped, unflipped))
    assert 0 < sum(flipped) < 16
    np.testing.assert_array_equal(apply([T.DecodeImage(), T.Cast("int16")], data), img.astype(np.int16))


# -- ndarray codecs -------------------------------------------------------------------------

NDARRAYS = [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
    np.arange(6, dtype=">i4").reshape(2, 3),
    np.array([1.5, -2.25], dtype=">f8"),
    np.array(7, dtype=np.int16),
    np.array([[True, False], [False, True]]),
    np.arange(10, dtype=np.uint16),
    np.random.default_rng(0).standard_normal((5, 2)).astype(np.float16),
    np.zeros((0, 3), dtype=np.uint8),
    np.asfortranarray(np.random.default_rng(1).integers(0, 100, (2, 3, 4)).astype(np.uint32)),
]


@pytest.mark.parametrize("index", range(len(NDARRAYS)))
def test_npy_round_trip_equals_numpy_load(index):
    a = NDARRAYS[index]
    b = io.BytesIO()
    np.save(b, a)
    got = apply([T.DecodeNdarray()], b.getvalue())
    ref = np.load(io.BytesIO(b.getvalue()))
    assert got.shape == ref.shape and got.dtype == ref.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("index", range(len(NDARRAYS)))
def test_npz_compressed_round_trip_equals_numpy_load(index):
    a = NDARRAYS[index]
    b = io.BytesIO()
    np.savez_compressed(b, a)
    got = apply([T.DecodeCompressedNdarray()], b.getvalue())
    ref = np.load(io.BytesIO(b.getvalue()))["arr_0"]
    np.testing.assert_array_equal(got, ref)
    assert got.shape == ref.shape


@pytest.mark.parametrize("blob", [b"", b"\x93NUMPY", b"junk" * 10, b"PK\x03\x04" + b"\0" * 40])
def test_corrupt_ndarray_bytes_raise(blob):
    with pytest.raises(pqloader.InvalidDataError):
        apply([T.DecodeCompressedNdarray() if blob.startswith(b"PK") else T.DecodeNdarray()], blob)


def test_truncated_npy_raises():
    b = io.BytesIO()
    np.save(b, np.arange(100, dtype=np.float64))
    with pytest.raises(pqloader.InvalidDataError, match="truncated"):
        apply([T.DecodeNdarray()], b.getvalue()[:-8])


# -- through the loader ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def image_ds(tmp_path_factory):
    """Real photos, cropped to uneven sizes, as JPEG; .npy arrays; ragged token lists."""
    rng = np.random.default_rng(42)
    pics = list(photos().values())
    images, arrays, tokens = [], [], []
    for i in range(60):
        p = pics[i % len(pics)]
        if p.ndim == 2:
            p = np.dstack([p] * 3)
        h, w = int(rng.integers(120, p.shape[0])), int(rng.integers(120, p.shape[1]))
        images.append(encode(np.ascontiguousarray(p[:h, :w]), "JPEG", quality=90))
        b = io.BytesIO()
        np.save(b, rng.standard_normal((2, 3)).astype(np.float32))
        arrays.append(b.getvalue())
        tokens.append(rng.integers(0, 1000, int(rng.integers(1, 12))).astype(np.int32).tolist())
    path = tmp_path_factory.mktemp("images") / "images.parquet"
    pq.write_table(pa.table({"id": np.arange(60, dtype=np.int64), "image": images, "arr": arrays,
                             "tok": pa.array(tokens, pa.list_(pa.int32()))}), path, row_group_size=9)
    return str(path), images, arrays, tokens


def augment():
    return {"image": [T.DecodeImage(), T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                      T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]), T.ToCHW()],
            "arr": [T.DecodeNdarray()], "tok": [T.PadOrTruncate(8, pad=-1)]}


def run(path, **kw):
    return list(pqloader.Loader(path, **kw))


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_transformed_batches_have_expected_columns_and_values(image_ds):
    path, images, arrays, tokens = image_ds
    batches = run(path, batch_size=16, transforms=augment())
    b = batches[0]
    assert list(b) == ["id", "image", "arr", "tok", "tok_length"]
    assert b["image"].shape == (16, 3, 48, 48) and b["image"].dtype == np.float32
    for i, row in enumerate(b["id"]):
        np.testing.assert_array_equal(b["arr"][i], np.load(io.BytesIO(arrays[row])))
        t = tokens[row]
        assert b["tok_length"][i] == min(len(t), 8)
        np.testing.assert_array_equal(b["tok"][i], (t + [-1] * 8)[:8])


def test_column_info_of_transformed_columns_is_what_their_batches_hold(image_ds):
    path = image_ds[0]
    loader = pqloader.Loader(path, batch_size=16, transforms=augment())
    info = loader.column_info
    b = next(iter(loader))
    for name in ("image", "tok", "id"):  # declared before any data, checked against it
        assert np.dtype(info[name]["dtype"]) == b[name].dtype, name
        assert info[name]["shape"] == b[name].shape[1:], name
    assert info["image"]["transformed"] and not info["id"]["transformed"]
    assert info["image"]["arrow_type"] == "binary"  # the stored column's
    # DecodeNdarray without Cast: the dtype and rank come with the data.
    assert info["arr"]["dtype"] is None and info["arr"]["shape"] is None
    # Without a fixed-size crop or resize, an image's height and width depend on it.
    decoded = pqloader.Loader(path, batch_size=1, columns=["image"], transforms={"image": [T.DecodeImage()]})
    assert decoded.column_info["image"]["dtype"] == "uint8"
    assert decoded.column_info["image"]["shape"] == (-1, -1, 3)
    assert next(iter(decoded))["image"][0].shape[2] == 3


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_augmentations_are_independent_of_workers_and_timing(image_ds, workers):
    path = image_ds[0]
    ref = run(path, batch_size=10, shuffle=True, seed=5, transforms=augment(), num_workers=1)
    got = run(path, batch_size=10, shuffle=True, seed=5, transforms=augment(), num_workers=workers,
              _debug_max_delay_us=2000)
    assert_same(ref, got)


def test_augmentations_follow_the_sample_not_its_position(image_ds):
    path = image_ds[0]
    plain = run(path, batch_size=60, shuffle=False, seed=5, transforms=augment())[0]
    shuffled = run(path, batch_size=60, shuffle=True, seed=5, transforms=augment())[0]
    order = np.argsort(shuffled["id"])
    np.testing.assert_array_equal(shuffled["image"][order], plain["image"])


def test_augmentations_differ_across_epochs_and_seeds(image_ds):
    path = image_ds[0]
    two = run(path, batch_size=60, seed=5, transforms=augment(), num_epochs=2)
    assert not np.array_equal(two[0]["image"], two[1]["image"])
    other = run(path, batch_size=60, seed=6, transforms=augment())
    assert not np.array_equal(two[0]["image"], other[0]["image"])
    np.testing.assert_array_equal(two[0]["arr"], other[0]["arr"])  # deterministic ops agree


def test_augmentations_resume_exactly(image_ds):
    path = image_ds[0]
    kw = dict(batch_size=7, shuffle=True, seed=9, transforms=augment(), num_epochs=2)
    full = run(path, **kw)
    for k in (0, 3, 9, 13):
        loader = pqloader.Loader(path, **kw)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        fresh = pqloader.Loader(path, **kw)
        fresh.load_state_dict(state)
        assert_same(list(fresh), full[k:])


def test_state_with_other_transforms_is_refused(image_ds):
    path = image_ds[0]
    state = pqloader.Loader(path, transforms=augment()).state_dict()
    other = augment()
    other["image"][1] = T.RandomResizedCrop(64)
    with pytest.raises(ValueError, match="transforms"):
        pqloader.Loader(path, transforms=other).load_state_dict(state)


def test_images_of_different_sizes_without_resize_raise_naming_the_column(image_ds):
    path = image_ds[0]
    loader = pqloader.Loader(path, batch_size=8, columns=["image"], transforms={"image": [T.DecodeImage()]})
    with pytest.raises(pqloader.InvalidDataError, match="'image'.*differ"):
        list(loader)


def test_ragged_lists_without_pad_raise(image_ds):
    with pytest.raises(pqloader.InvalidDataError, match="'tok'"):
        list(pqloader.Loader(image_ds[0], columns=["tok"]))


@pytest.fixture()
def corrupt_ds(tmp_path):
    img = encode(skdata.chelsea()[:100, :100], "JPEG", quality=90)
    images = [img] * 20
    images[13] = img[: len(img) // 3]          # truncated
    images[17] = b"definitely not an image"   # garbage
    path = tmp_path / "corrupt.parquet"
    pq.write_table(pa.table({"id": np.arange(20, dtype=np.int64), "image": images}), path, row_group_size=6)
    return str(path)


def test_corrupt_image_error_names_file_row_group_row_and_column(corrupt_ds):
    loader = pqloader.Loader(corrupt_ds, batch_size=4, transforms={"image": [T.DecodeImage(), T.Resize(32)]})
    with pytest.raises(pqloader.InvalidDataError) as e:
        list(loader)
    msg = str(e.value)
    assert "corrupt.parquet" in msg and "row group 2" in msg and "row 1" in msg and "'image'" in msg


def test_skip_policy_drops_bad_samples_counts_them_and_keeps_batch_counts(corrupt_ds):
    tf = {"image": [T.DecodeImage(), T.CenterCrop(64), T.RandomHorizontalFlip()]}
    counts = []
    for rank in range(2):
        loader = pqloader.Loader(corrupt_ds, batch_size=4, transforms=tf, on_decode_error="skip",
                                 rank=rank, world_size=2)
        batches = list(loader)
        counts.append(len(batches))
        ids = np.concatenate([b["id"] for b in batches])
        assert 13 not in ids and 17 not in ids
        assert all(b["image"].shape[1:] == (64, 64, 3) for b in batches if len(b["id"]))
        expected_skips = sum(i in (13, 17) for i in range(rank * 10, rank * 10 + 10))
        assert loader.stats()["skipped_rows"] == expected_skips
        assert len(ids) == 10 - expected_skips
    assert counts[0] == counts[1] == 3


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_batch_whose_rows_are_all_skipped_has_empty_arrays_of_each_columns_dtype_and_shape(
        tmp_path, cached, output):
    """Rows 4-7 (all of batch 1) hold corrupt images: the batch still comes (batch counts do
    not depend on the data, so ranks stay in step), with 0 rows in arrays of the dtype and
    row shape the ops give (0 where the shape depends on the data), never a list."""
    img = encode(skdata.chelsea()[:40, :50], "PNG")
    images = [img] * 4 + [b"not an image"] * 4 + [img] * 2
    arrays = []
    for i in range(10):
        b = io.BytesIO()
        np.save(b, np.arange(i % 3 + 1, dtype=np.int16))
        arrays.append(b.getvalue())
    path = tmp_path / "mostly_bad.parquet"
    pq.write_table(pa.table({"id": np.arange(10, dtype=np.int64), "image": images, "raw": images,
                             "arr": arrays, "tok": [[1, 2]] * 10, "s": ["x"] * 10}),
                   path, row_group_size=5)
    tf = {"image": [T.DecodeImage(), T.CenterCrop(16), T.Normalize([0.5] * 3, [0.2] * 3), T.ToCHW()],
          "raw": [T.DecodeImage()],
          "arr": [T.DecodeNdarray(), T.Cast("float32"), T.PadOrTruncate(4)]}
    loader = pqloader.Loader(str(path), batch_size=4, transforms=tf, on_decode_error="skip",
                             lists={"tok": "ragged"}, output=output,
                             cache_dir=str(tmp_path / "cache") if cached else None)
    batches = list(loader)
    assert [len(b["id"]) for b in batches] == [4, 0, 2]
    assert loader.stats()["skipped_rows"] == 4
    as_numpy = (lambda v: v.numpy()) if output == "torch" else (lambda v: v)
    full, empty = batches[0], batches[1]
    expected = {"id": (np.int64, (0,)), "image": (np.float32, (0, 3, 16, 16)),
                "raw": (np.uint8, (0, 0, 0, 3)), "arr": (np.float32, (0, 4)),
                "arr_length": (np.int64, (0,)), "tok": (np.int64, (0,)),
                "tok_offsets": (np.int64, (1,))}
    assert set(empty) == set(expected) | {"s"}
    for name, (dtype, shape) in expected.items():
        got = as_numpy(empty[name])
        assert isinstance(got, np.ndarray), (name, type(empty[name]))
        assert (got.dtype, got.shape) == (np.dtype(dtype), shape), name
        # the same dtype and rank as a batch with rows
        assert as_numpy(full[name]).dtype == got.dtype and as_numpy(full[name]).ndim == got.ndim, name
    assert empty["s"] == []  # strings are lists in every batch
    assert as_numpy(empty["tok_offsets"]).tolist() == [0]


def test_batch_transform_callable_runs_in_order_and_raises_at_the_consumer(image_ds):
    path = image_ds[0]

    def add_sum(batch):
        batch["id_plus"] = batch["id"] + 1000
        return batch

    batches = run(path, batch_size=7, shuffle=True, seed=1, columns=["id"], transforms=add_sum, num_workers=2)
    ref = run(path, batch_size=7, shuffle=True, seed=1, columns=["id"])
    assert len(batches) == len(ref) == 9  # ceil(60 / 7)
    for b, r in zip(batches, ref):
        np.testing.assert_array_equal(b["id_plus"], r["id"] + 1000)

    def boom(batch):
        if batch["id"].min() > 20:
            raise RuntimeError("boom in batch transform")
        return batch

    with pytest.raises(RuntimeError, match="boom"):
        run(path, batch_size=7, columns=["id"], batch_transform=boom)


def test_unknown_transform_parameters_are_refused():
    with pytest.raises(ValueError):
        T.Resize(0)
    with pytest.raises(ValueError):
        T.DecodeImage(mode="cmyk")
    with pytest.raises(TypeError, match="not an op"):
        pqloader.Loader("x", transforms={"a": ["not an op"]})


def test_transforms_of_a_text_column_are_refused_when_the_loader_is_made(tmp_path):
    # Ops see a row's bytes: Cast('float32') of the text '1.5' would be [49, 46, 53], so
    # text and lists of strings are refused, naming the column; a binary column's bytes
    # (raw pixels, say) are numbers on purpose.
    pq.write_table(pa.table({"price": ["1.5", "2.5"], "words": pa.array([["a"], ["b"]]),
                             "blobs": pa.array([[b"a"], [b"b"]]), "raw": [b"ab", b"cd"]}),
                   tmp_path / "p.parquet")
    for col in ("price", "words", "blobs"):
        for op in (pqloader.transforms.Cast("float32"), pqloader.transforms.PadOrTruncate(4)):
            with pytest.raises(pqloader.UnsupportedTypeError, match=rf"column '{col}' .* holds"):
                pqloader.Loader(str(tmp_path), transforms={col: [op]})
    got = next(iter(pqloader.Loader(str(tmp_path), columns=["raw"],
                                    transforms={"raw": [pqloader.transforms.Cast("float32")]})))
    assert got["raw"].tolist() == [[97.0, 98.0], [99.0, 100.0]]


def test_transforms_of_a_text_column_read_as_bytes_are_refused_too(tmp_path):
    # strings="bytes" hands text out as bytes, but ops of it would still see its UTF-8
    # codes: Cast('float32') of '1.5' had been [49, 46, 53] (refused only as str).
    pq.write_table(pa.table({"price": ["1.5", "2.5"], "cat": pa.array(["1.5", "2.5"]).dictionary_encode(),
                             "raw": [b"ab", b"cd"]}), tmp_path / "p.parquet")
    for col in ("price", "cat"):
        for ops in ([T.Cast("float32")], [T.Cast("float32"), T.PadOrTruncate(4)]):
            with pytest.raises(pqloader.UnsupportedTypeError, match=rf"column '{col}' .* holds text"):
                pqloader.Loader(str(tmp_path), strings="bytes", transforms={col: ops})
    got = next(iter(pqloader.Loader(str(tmp_path), columns=["raw"], strings="bytes",
                                    transforms={"raw": [T.Cast("float32")]})))
    assert got["raw"].tolist() == [[97.0, 98.0], [99.0, 100.0]]


def test_pad_or_truncate_alone_on_a_scalar_column_is_refused_when_the_loader_is_made(tmp_path):
    # It was accepted, and the first batch failed as if the data were wrong.
    pq.write_table(pa.table({"id": [1, 2], "b": [b"abc", b"d"], "s": ["x", "y"]}), tmp_path / "p.parquet")
    for col, extra, why in (("id", {}, "is not a list of numbers"), ("b", {}, r"is not a list of numbers.*Cast\('uint8'\)"),
                            ("s", {"strings": "bytes"}, "holds text")):
        with pytest.raises(pqloader.UnsupportedTypeError, match=rf"column '{col}' .*{why}"):
            pqloader.Loader(str(tmp_path), columns=[col], transforms={col: [T.PadOrTruncate(4)]}, **extra)
    got = next(iter(pqloader.Loader(str(tmp_path), columns=["b"],
                                    transforms={"b": [T.Cast("uint8"), T.PadOrTruncate(4, pad=7)]})))
    assert got["b"].tolist() == [[97, 98, 99, 7], [100, 7, 7, 7]]


def test_the_state_fingerprint_of_a_pipeline_keeps_its_text(tmp_path):
    # States saved by earlier versions hold this text: writing its numbers exactly (as
    # cache keys now do) would refuse every such state (ratio=[0.75, 1.3333333333333333]).
    pq.write_table(pa.table({"image": [b"x"]}), tmp_path / "p.parquet")
    ops = [T.DecodeImage(), T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
           T.Normalize([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]),
           T.ToCHW()]
    loader = pqloader.Loader(str(tmp_path), transforms={"image": ops})
    assert loader._engine.transform_fingerprint() == (
        "0:DecodeImage(mode=rgb);RandomResizedCrop(size=[224, 224], scale=[0.08, 1], "
        "ratio=[0.75, 1.33333]);RandomHorizontalFlip(p=0.5);Normalize(mean=[0.481455, 0.457827, "
        "0.408211], std=[0.26863, 0.261303, 0.275777]); ToCHW();|")


def test_a_resize_of_a_tiny_hostile_image_past_the_image_limit_is_refused():
    # A 1 x 100000 PNG of a few hundred bytes resized to 256 x 25.6M (19.7 GB of pixels,
    # and weight tables for the whole extent, also where CenterCrop then keeps 224 x 224)
    # took gigabytes per worker; the decoders' 2 GiB limit of an image now holds here too.
    b = io.BytesIO()
    Image.new("RGB", (100000, 1), (10, 20, 30)).save(b, format="PNG")
    assert len(b.getvalue()) < 1000
    for ops in ([T.DecodeImage(), T.Resize(256)], [T.DecodeImage(), T.Resize(256), T.CenterCrop(224)]):
        with pytest.raises(ValueError, match="exceed the 2 GiB limit of an image"):
            _core._apply_ops([op._spec() for op in ops], b.getvalue(), 0, 0, 0)


def _png_chunk(kind, data):
    import zlib
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def test_a_jpeg_with_an_unknown_marker_is_corrupt_not_unsupported():
    # "Unsupported marker type" is a corrupt header's stray byte, not a valid file
    # libjpeg-turbo does not decode (12-bit, lossless): it was called "unsupported JPEG".
    data = encode(np.zeros((8, 8, 3), np.uint8), "JPEG")
    bad = data[:2] + b"\xff\x02\x00\x04ab" + data[2:]
    with pytest.raises(pqloader.InvalidDataError, match="corrupt JPEG header") as e:
        _core._apply_ops([T.DecodeImage("rgb")._spec()], bad, 0, 0, 0)
    assert "unsupported" not in str(e.value)


def test_a_png_past_the_image_limit_names_its_size():
    # It said "corrupt PNG data: image too large": no size, and a limit is no corruption.
    import zlib
    ihdr = (60000).to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    png = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
           + _png_chunk(b"IEND", b""))
    with pytest.raises(pqloader.InvalidDataError, match=r"PNG image of 60000x60000 is too large") as e:
        _core._apply_ops([T.DecodeImage("gray")._spec()], png, 0, 0, 0)
    assert "corrupt" not in str(e.value)


def test_a_large_png_is_decoded_into_its_sample_without_a_second_copy():
    # The rows went into a buffer of their own, then were copied into the sample: a
    # 12,000 x 12,000 gray PNG (144 MB of pixels) took 288 MB; a 2 GiB one 4 GiB.
    import resource
    import subprocess
    import sys
    import zlib
    side = 12000
    z = zlib.compressobj(9)
    row = b"\x00" + bytes(range(256)) * (side // 256) + bytes(side % 256)
    data = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    png = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", data)
           + _png_chunk(b"IEND", b""))
    script = (
        "import resource, sys\n"
        "from pqloader import _core, transforms as T\n"
        "png = sys.stdin.buffer.read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = _core._apply_ops([T.DecodeImage('gray')._spec()], png, 0, 0, 0)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "import numpy as np\n"
        "a = np.asarray(out)\n"
        "print(a.shape, int(a[5, 300, 0]), (after - before) >> 10)\n")
    run = subprocess.run([sys.executable, "-c", script], input=png, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    out = run.stdout.decode()
    assert out.startswith("(12000, 12000, 1) 44 "), out  # pixel 300 of the row: 300 % 256
    assert int(out.split()[-1]) < 144 * 1.5, out  # MB: one image's bytes (144 MB), not two


@pytest.mark.skipif(bool(os.environ.get("PQLOADER_EXPECT_SANITIZED")),
                    reason="ASan's shadow memory does not fit under an address-space limit")
def test_an_image_that_memory_cannot_hold_is_a_memory_error_naming_the_row(tmp_path):
    # A 46000 x 46000 1-bit gray PNG (257 KB, inside the 2 GiB pixel limit) decoded with
    # 1.8 GB of address space left: std::bad_alloc escaped DecodeImage's buffers and came
    # out as "unexpected exception in worker: std::bad_alloc" (no file, row group, row or
    # column; not a MemoryError), where a failed AllocateSample names them all.
    import subprocess
    import sys
    import zlib
    ihdr = (46000).to_bytes(4, "big") * 2 + bytes([1, 0, 0, 0, 0])
    row = b"\x00" * (1 + 46000 // 8)
    packer = zlib.compressobj(9)
    z = b"".join([packer.compress(row * 1000) for _ in range(46)] + [packer.flush()])

    bomb = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", z)
            + _png_chunk(b"IEND", b""))
    small = encode(np.zeros((4, 4), np.uint8), "PNG")
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"id": np.arange(8), "image": [small] * 5 + [bomb] + [small] * 2}),
                   path, row_group_size=4)
    script = f"""
import re, resource, pqloader
from pqloader import transforms as T
vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (1800 << 20), resource.RLIM_INFINITY))
loader = pqloader.Loader({str(path)!r}, batch_size=4, num_workers=1,
                         transforms={{"image": [T.DecodeImage("gray"), T.Resize(64)]}})
try:
    list(loader)
except MemoryError as e:
    print("MemoryError", e)
except Exception as e:
    print(type(e).__name__, e)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert out.startswith("MemoryError"), (out, run.stderr[-2000:])
    assert "bomb.parquet" in out and "row group 1" in out and "row 1" in out and "'image'" in out, out


@pytest.mark.parametrize("ratio", [(0.001, 0.01), (100.0, 1000.0)])
def test_random_resized_crop_of_an_empty_fallback_box_is_an_error_not_a_black_image(ratio):
    # The central-crop fallback rounds one side to 0 when the ratio range is far from the
    # image's: the resize of that empty box returned zeros (torchvision raises).
    img = np.full((20, 24, 3), 7, np.uint8)
    with pytest.raises(ValueError, match="cannot resize an empty crop"):
        apply([T.DecodeImage(), T.RandomResizedCrop(16, ratio=ratio)], encode(img, "PNG"))


@pytest.mark.parametrize("shape", [(0, 6, 3), (5, 0, 3), (0, 0)])
@pytest.mark.parametrize("crop", [False, True])
def test_resize_of_an_empty_array_is_an_error_naming_its_size(shape, crop):
    # An empty side made the output's other side size * h / 0: infinite, cast to an
    # integer (undefined behaviour; here INT64_MIN, "cannot resize to an empty image").
    b = io.BytesIO()
    np.save(b, np.zeros(shape, np.uint8))
    ops = [T.DecodeNdarray(), T.Resize(8)] + ([T.CenterCrop(8)] if crop else [])
    with pytest.raises(ValueError, match=rf"cannot resize an empty image \({shape[0]}x{shape[1]}\)"):
        apply(ops, b.getvalue())


@pytest.mark.parametrize("name,size,target", [("astronaut", (640, 480), 48), ("astronaut", (500, 375), 32),
                                              ("immunohistochemistry", (640, 480), 96)])
def test_small_resize_targets_stay_within_the_dct_tolerance(name, size, target):
    # DCT scaling at 1/4 and 1/8 for targets under 128 read mean |diff| 1.54-2.2 against
    # a full decode + Resize (a helper's cases): such targets decode at full size.
    im = Image.fromarray(getattr(skdata, name)()).resize(size, Image.LANCZOS)
    data = encode(np.asarray(im), "JPEG", quality=90)
    full = apply([T.DecodeImage()], data)
    reference = apply([T.DecodeImage(), T.Resize(target)], encode(full, "PNG"))  # never scaled
    got = apply([T.DecodeImage(), T.Resize(target)], data)
    assert got.shape == reference.shape
    assert np.abs(got.astype(int) - reference.astype(int)).mean() < DCT_MEAN_DIFF


@pytest.mark.parametrize("make, error", [
    (lambda: T.Resize(True), TypeError),                   # was a 1-pixel resize
    (lambda: T.CenterCrop(True), TypeError),
    (lambda: T.PadOrTruncate(True), TypeError),
    (lambda: T.CenterCrop("12"), TypeError),               # was size (1, 2)
    (lambda: T.CenterCrop((2.7, 3)), TypeError),           # was silently 2
    (lambda: T.Normalize("12", "34"), TypeError),          # was mean [1, 2]
    (lambda: T.RandomHorizontalFlip("0.5"), TypeError),
    (lambda: T.RandomResizedCrop(8, scale=(0.5,)), ValueError),
    (lambda: T.Cast(None), TypeError),                      # was float64
    (lambda: T.PadOrTruncate(4, pad="x"), TypeError),       # was pad 0
    (lambda: T.Resize(10**20), ValueError),                 # was UB (double -> int64) in C++
    (lambda: T.CenterCrop(2**62), ValueError),              # was an error at the first row
])
def test_wrong_kinds_and_sizes_of_parameters_are_refused(make, error):
    with pytest.raises(error):
        make()


def test_numpy_scalar_parameters_are_taken_and_a_numpy_pad_is_checked(tmp_path):
    assert T.Resize(np.int64(3)) == T.Resize(3)
    assert T.CenterCrop(np.int32(3)) == T.CenterCrop(3)
    assert T.PadOrTruncate(np.int64(3)) == T.PadOrTruncate(3)
    pq.write_table(pa.table({"l": pa.array([[1, 2]] * 4, pa.list_(pa.uint8()))}), tmp_path / "l.parquet")
    # np.int64(300) skipped the check that the pad fits the column: written as 44.
    with pytest.raises(ValueError, match="does not fit"):
        pqloader.Loader(str(tmp_path), transforms={"l": [T.PadOrTruncate(4, pad=np.int64(300))]})
    batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=4,
                                      transforms={"l": [T.PadOrTruncate(4, pad=np.uint8(7))]})))
    assert batch["l"][0].tolist() == [1, 2, 7, 7]


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_ops_that_cannot_take_a_column_are_refused_when_the_loader_is_made(tmp_path, policy):
    """Resize of uint16 pixels, an image op on a 1-D column, three means for a gray
    image, a decoder on rows that are not encoded bytes (numbers, a decoded image):
    refused by Loader(...), naming the column; they failed at the first row, and with
    on_decode_error='skip' every row was skipped (batches of 0 rows all epoch)."""
    path = tmp_path / "t.parquet"
    u16 = np.arange(2 * 4 * 6 * 3, dtype=np.uint16).reshape(2, 4, 6, 3)
    gray = np.zeros((2, 4, 6), np.uint8)
    png = encode(photos()["camera"][:5, :7], "PNG")
    table = pa.table({"u16img": pa.FixedShapeTensorArray.from_numpy_ndarray(u16),
                      "gray": pa.FixedShapeTensorArray.from_numpy_ndarray(gray),
                      "vec": pa.array([[1.0, 2.0], [3.0]]), "n": np.arange(2), "png": [png, png],
                      "png_list": pa.array([list(png)] * 2, pa.list_(pa.uint8()))})
    pq.write_table(table, path)
    cases = [("u16img", [T.Resize(2)]), ("vec", [T.RandomHorizontalFlip(1.0)]),
             ("gray", [T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])]),
             ("n", [T.DecodeImage()]), ("vec", [T.DecodeNdarray()]),
             ("gray", [T.DecodeCompressedNdarray()]), ("png", [T.DecodeImage(), T.DecodeImage()])]
    for column, ops in cases:
        with pytest.raises(pqloader.UnsupportedTypeError, match=f"column '{column}'"):
            pqloader.Loader(str(path), columns=[column], transforms={column: ops},
                            on_decode_error=policy, batch_size=2)
    # What the data decides stays with the data: these load.
    ok = pqloader.Loader(str(path), columns=["gray"], transforms={"gray": [T.Normalize([0.5], [0.2])]},
                         on_decode_error=policy, batch_size=2)
    assert next(iter(ok))["gray"].shape == (2, 4, 6)
    # A list of uint8 holds encoded bytes as a binary column does.
    ok = pqloader.Loader(str(path), columns=["png_list"], transforms={"png_list": [T.DecodeImage()]},
                         on_decode_error=policy, batch_size=2)
    assert next(iter(ok))["png_list"].shape == (2, 5, 7, 3)


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize("to", ["uint64", "int64", "int32", "uint32", "int16", "uint8", "int8", "float32"])
@pytest.mark.parametrize("src", ["int64", "uint64"])
def test_cast_between_integers_wraps_as_numpy_and_keeps_every_bit(src, to):
    # Through a double, int64 lost every bit past 2^53, a narrowing out of range was
    # undefined (2^32 + 5 to int32 gave INT_MIN; numpy 5) and int64 to float32 rounded twice.
    a = np.array([2**53 + 1, 2**32 + 5, 2**62 + 1, 2**60 + 2**36 + 1, 7, 2**63 - 1], np.uint64).astype(src)
    if src == "int64":
        a = np.concatenate([a, np.array([-1, -(2**53) - 1, -(2**63)], np.int64)])
    got = apply([T.DecodeNdarray(), T.Cast(to)], _npy(a))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, a.astype(to))


def test_cast_of_an_int64_column_keeps_values_past_2_53(tmp_path):
    vals = np.array([2**53 + 1, 2**62 + 1, -1], np.int64)
    pq.write_table(pa.table({"x": vals}), tmp_path / "c.parquet")
    b = next(iter(pqloader.Loader(str(tmp_path), batch_size=3, transforms={"x": [T.Cast("uint64")]})))
    assert b["x"].tolist() == vals.astype(np.uint64).tolist()


def test_a_state_padding_with_another_value_past_the_sixth_digit_is_refused(tmp_path):
    # The fingerprint kept 6 digits of the pad: 1000000 and 1000001 were one state.
    pq.write_table(pa.table({"x": pa.array([[1, 2], [3], [4, 5, 6], [7]], pa.list_(pa.int64()))}),
                   tmp_path / "p.parquet", row_group_size=2)

    def make(pad):
        return pqloader.Loader(str(tmp_path), batch_size=2, transforms={"x": [T.PadOrTruncate(3, pad=pad)]})

    loader = make(1000000)
    next(iter(loader))
    state = loader.state_dict()
    make(1000000).load_state_dict(state)  # the same pad resumes
    with pytest.raises(ValueError, match="transforms"):
        make(1000001).load_state_dict(state)
    # Usual pads keep the text states saved before hold.
    assert make(-1)._engine.transform_fingerprint() == "0:PadOrTruncate(length=3, pad=-1)|"
    assert make(-7)._engine.transform_fingerprint() == "0:PadOrTruncate(length=3, pad=-7)|"


@pytest.mark.parametrize("a", [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=">i8"),
                               np.array(3.5), np.zeros((0, 3), np.int16),
                               np.asfortranarray(np.arange(24).reshape(2, 3, 4))], ids=str)
def test_an_uncompressed_npz_of_numpy_savez_decodes(a):
    # numpy writes every member zip64 (sizes in an extra field): all were refused.
    b = io.BytesIO()
    np.savez(b, arr=a)  # a stored member, its sizes in a zip64 extra field
    got = apply([T.DecodeCompressedNdarray()], b.getvalue())
    assert got.shape == a.shape
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("pad", [300, -100, 0.5])
def test_a_pad_that_does_not_fit_the_decoded_dtype_is_an_error_not_wrapped(tmp_path, pad):
    # The dtype is known only after DecodeNdarray: the Loader cannot check the pad when made.
    pq.write_table(pa.table({"a": [_npy(np.array([1, 2], np.uint8)), _npy(np.array([3], np.uint8))]}),
                   tmp_path / "n.parquet")
    for ops, lists in (([T.DecodeNdarray(), T.PadOrTruncate(4, pad=pad)], None),
                       ([T.DecodeNdarray()], {"a": pqloader.Pad(4, value=pad)})):
        loader = pqloader.Loader(str(tmp_path), batch_size=2, transforms={"a": ops}, lists=lists)
        with pytest.raises(pqloader.InvalidDataError, match=r"'a'.*uint8"):
            next(iter(loader))
    b = next(iter(pqloader.Loader(str(tmp_path), batch_size=2,
                                  transforms={"a": [T.DecodeNdarray(), T.PadOrTruncate(4, pad=7)]})))
    assert b["a"].tolist() == [[1, 2, 7, 7], [3, 7, 7, 7]]


def _npy_bytes(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize("src", ["float64", "float32"])
def test_cast_of_nan_inf_and_out_of_range_floats_is_defined(src):
    # A C++ cast of these is undefined (x86-64 gives INT_MIN, ARM saturates, a compiler
    # may fold either): pinned to x86-64's values (NumPy's element-wise astype and torch
    # give the same, but for uint32), on every platform.
    v = np.array([np.nan, np.inf, -np.inf, 300.0, -1.0, 1e10, -1e10, 5e9, 2.0**63, 1e20, -0.9, 2.5]).astype(src)
    want = {"int8": [0, 0, 0, 44, -1, 0, 0, 0, 0, 0, 0, 2], "uint8": [0, 0, 0, 44, 255, 0, 0, 0, 0, 0, 0, 2],
            "int16": [0, 0, 0, 300, -1, 0, 0, 0, 0, 0, 0, 2], "uint16": [0, 0, 0, 300, 65535, 0, 0, 0, 0, 0, 0, 2],
            "int32": [-2**31] * 3 + [300, -1] + [-2**31] * 5 + [0, 2],
            "uint32": [0, 0, 0, 300, 2**32 - 1, 1410065408, 2884901888, 705032704, 0, 0, 0, 2],
            "int64": [-2**63] * 3 + [300, -1, 10**10, -10**10, 5 * 10**9, -2**63, -2**63, 0, 2],
            "uint64": [2**63, 0, 2**63, 300, 2**64 - 1, 10**10, 2**64 - 10**10, 5 * 10**9, 2**63, 0, 0, 2],
            "bool": [True] * 12}
    for to, w in want.items():
        assert apply([T.DecodeNdarray(), T.Cast(to)], _npy_bytes(v)).tolist() == w, to


def test_random_resized_crop_of_extreme_scales_and_ratios_stays_in_the_image():
    # Sizes of 1e153 (or inf, NaN) were cast to int64 before the range check (undefined).
    img = np.arange(6 * 5 * 3, dtype=np.uint8).reshape(6, 5, 3)
    for op in (T.RandomResizedCrop(2, scale=(0.5, 1e300)), T.RandomResizedCrop(2, ratio=(1e-300, 1e300))):
        for sample in range(20):
            out = apply([T.DecodeNdarray(), op], _npy_bytes(img), sample=sample)
            assert out.shape == (2, 2, 3)


def test_an_npz_of_several_arrays_is_refused_not_its_first_taken():
    # The first member was decoded silently (Petastorm's codec reads the one named arr).
    b = io.BytesIO()
    np.savez_compressed(b, x=np.zeros(3), arr=np.ones(3))
    with pytest.raises(pqloader.InvalidDataError, match="holds 2 arrays"):
        apply([T.DecodeCompressedNdarray()], b.getvalue())
    one = io.BytesIO()
    np.savez_compressed(one, arr=np.ones(3))
    assert apply([T.DecodeCompressedNdarray()], one.getvalue()).tolist() == [1.0, 1.0, 1.0]


def test_an_npz_whose_array_fails_its_crc_is_refused_not_decoded_altered(tmp_path):
    """np.load (zipfile) checks each member's CRC-32; the member was decoded unchecked: a
    flipped bit in a stored array was a silently altered value, and in a deflated one (raw
    deflate has no checksum) 43 of 342 single-bit flips inflated to other values."""
    a = np.arange(16, dtype=np.float32)
    stored = io.BytesIO()
    np.savez(stored, arr=a)
    flipped = bytearray(stored.getvalue())
    at = flipped.index(a.tobytes()) + 4 * 5  # a bit of a[5]
    flipped[at] ^= 1
    compressed = io.BytesIO()
    np.savez_compressed(compressed, arr=a)
    wrong_crc = bytearray(compressed.getvalue())
    wrong_crc[14] ^= 1  # the local header's CRC-32 (np.load reads the central directory's)
    wrong_crc[wrong_crc.index(b"PK\x01\x02") + 16] ^= 1
    for blob in (bytes(flipped), bytes(wrong_crc)):
        with pytest.raises(Exception, match="CRC-32"):
            np.load(io.BytesIO(blob))["arr"]
        with pytest.raises(pqloader.InvalidDataError, match="CRC-32"):
            apply([T.DecodeCompressedNdarray()], blob)
    # under on_decode_error="skip" such a row is skipped and counted, not taken
    path = tmp_path / "npz.parquet"
    pq.write_table(pa.table({"id": np.arange(3), "z": [stored.getvalue(), bytes(flipped),
                                                        compressed.getvalue()]}), path)
    with pqloader.Loader(str(path), batch_size=3, on_decode_error="skip",
                         transforms={"z": [T.DecodeCompressedNdarray()]}) as loader:
        (batch,) = list(loader)
        assert batch["id"].tolist() == [0, 2] and loader.stats()["skipped_rows"] == 1
    np.testing.assert_array_equal(batch["z"], np.stack([a, a]))


def test_an_npz_cut_before_its_end_record_is_refused_not_its_first_array_taken():
    """An archive without its end-of-central-directory record is cut short (np.load:
    "File is not a zip file"); the count of its arrays is then unknown: the first of two
    was decoded silently, past the check that refuses several."""
    b = io.BytesIO()
    np.savez_compressed(b, x=np.zeros(3), arr=np.ones(3))
    cut = b.getvalue()[:b.getvalue().index(b"PK\x01\x02")]
    with pytest.raises(Exception):
        np.load(io.BytesIO(cut))
    with pytest.raises(pqloader.InvalidDataError, match="truncated .npz"):
        apply([T.DecodeCompressedNdarray()], cut)


def test_a_stored_npz_written_to_a_stream_decodes():
    """A stored member written to an unseekable stream keeps its sizes and CRC-32 in a data
    descriptor (general purpose bit 3) and the central directory; it was refused as "not a
    .npy array (bad magic)", where np.load reads it."""
    import zipfile

    class Stream(io.RawIOBase):
        def __init__(self):
            self.data = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.data += b
            return len(b)

    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        out = Stream()
        with zipfile.ZipFile(out, "w", compression=method) as z, z.open("arr.npy", "w") as f:
            np.lib.format.write_array(f, a)
        np.testing.assert_array_equal(np.load(io.BytesIO(bytes(out.data)))["arr"], a)
        np.testing.assert_array_equal(apply([T.DecodeCompressedNdarray()], bytes(out.data)), a)


def _nullable_npy_column(tmp_path) -> str:
    # Row 2 of "b" is null; the others are .npy arrays of 3 float32.
    vals = [_npy_bytes(np.arange(3, dtype=np.float32) + i) if i != 2 else None for i in range(6)]
    path = str(tmp_path / "n.parquet")
    pq.write_table(pa.table({"a": np.arange(6), "b": pa.array(vals, pa.binary())}), path)
    return path


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_null_mask_of_a_decoded_column_without_a_fill_names_the_null_row(tmp_path, policy):
    # A masked null row was decoded from b'': "not a .npy array (bad magic)" for a row
    # that is null, or with skip dropped as a corrupt row while '<col>_valid' said all True.
    path = _nullable_npy_column(tmp_path)
    loader = pqloader.Loader(path, batch_size=6, null_mask=["b"], on_decode_error=policy,
                             transforms={"b": [T.DecodeNdarray()]})
    with pytest.raises(pqloader.InvalidDataError, match=r"row 2, column 'b': the row is null"):
        list(loader)
    # A column of no null row loads with its mask (all valid)
    no_nulls = str(tmp_path / "full.parquet")
    pq.write_table(pa.table({"b": pa.array([_npy_bytes(np.ones(2, np.float32))] * 3, pa.binary())}),
                   no_nulls)
    (batch,) = list(pqloader.Loader(no_nulls, batch_size=6, null_mask=["b"], on_decode_error=policy,
                                    transforms={"b": [T.DecodeNdarray()]}))
    assert batch["b_valid"].tolist() == [True] * 3 and batch["b"].shape == (3, 2)


@pytest.mark.parametrize("op,fill", [(T.DecodeNdarray(), b""), (T.DecodeNdarray(), b"PK\x03\x04"),
                                     (T.DecodeCompressedNdarray(), b"\x93NUMPY"),
                                     (T.DecodeImage(), b"GIF89a")])
def test_a_fill_null_that_the_decode_op_cannot_decode_is_refused_when_made(tmp_path, op, fill):
    path = _nullable_npy_column(tmp_path)
    with pytest.raises(ValueError, match=r"fill_null\['b'\].* is not .*decoded by " + type(op).__name__):
        pqloader.Loader(path, batch_size=6, fill_null={"b": fill}, on_decode_error="skip",
                        transforms={"b": [op]})


def test_a_decodable_fill_null_stands_in_for_a_masked_null_row(tmp_path):
    path = _nullable_npy_column(tmp_path)
    with pqloader.Loader(path, batch_size=6, null_mask=["b"], on_decode_error="skip",
                         fill_null={"b": _npy_bytes(np.full(3, -1, np.float32))},
                         transforms={"b": [T.DecodeNdarray()]}) as loader:
        (batch,) = list(loader)
        assert loader.stats()["skipped_rows"] == 0
    assert batch["a"].tolist() == list(range(6))
    assert batch["b_valid"].tolist() == [True, True, False, True, True, True]
    assert batch["b"][2].tolist() == [-1, -1, -1] and batch["b"][3].tolist() == [3, 4, 5]


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_masked_null_row_that_cannot_decode_is_named_null_and_never_skipped(tmp_path, policy, shuffle):
    # null_mask=True (not refused when made: most nullable columns hold no null): the null
    # row's b'' failed as "bad magic" with nothing saying the row is null, or with skip
    # was dropped and counted as a corrupt row while b_valid said all True.
    path = _nullable_npy_column(tmp_path)
    loader = pqloader.Loader(path, batch_size=6, null_mask=True, on_decode_error=policy,
                             shuffle=shuffle, seed=1, transforms={"b": [T.DecodeNdarray()]})
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"row group 0, row 2, column 'b': the row is null.*bad magic.*"
                             r"fill_null=\{'b'.*is_valid"):
        list(loader)
    # With a decodable fill, the null row is kept and flagged
    with pqloader.Loader(path, batch_size=6, null_mask=True, on_decode_error=policy,
                         fill_null={"b": _npy_bytes(np.zeros(3, np.float32))},
                         transforms={"b": [T.DecodeNdarray()]}) as loader:
        (batch,) = list(loader)
        assert batch["b_valid"].tolist() == [True, True, False, True, True, True]
        assert loader.stats()["skipped_rows"] == 0


def test_an_npz_whose_comment_holds_the_end_signature_is_one_array():
    # The end-of-central-directory scan took the signature inside the comment for the
    # record, and its bytes for a count of 2 arrays.
    import zipfile
    b = io.BytesIO()
    np.savez_compressed(b, arr=np.ones(3))
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(b.getvalue())) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        # (a record of 2 entries inside the comment, not at its end: not the record)
        zout.comment = b"PK\x05\x06" + b"\x00" * 6 + b"\x02\x00" + b"\x00" * 10 + b"tail"
    # (Python's zipfile takes the last signature whatever follows it; the zip format's
    # record is the one whose comment ends the archive)
    assert apply([T.DecodeCompressedNdarray()], out.getvalue()).tolist() == [1.0, 1.0, 1.0]
    plain = io.BytesIO(b.getvalue())
    with zipfile.ZipFile(plain, "a") as z:  # a plain comment
        z.comment = b"hello"
    assert apply([T.DecodeCompressedNdarray()], plain.getvalue()).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", [float("nan"), 1e30, -1, 2.5])
def test_decode_image_min_short_side_is_checked_before_its_cast(bad):
    # A C++ caller's NaN or 1e30 was cast to int64 unchecked (undefined); -1 was taken.
    data = encode(photos()["astronaut"][:64, :64], "PNG")
    with pytest.raises(pqloader.InvalidDataError, match="min_short_side must be a whole number"):
        _core._apply_ops([("DecodeImage", {"mode": "rgb", "min_short_side": bad})], data, 0, 0, 0)


def test_a_masked_null_struct_field_that_cannot_decode_names_a_filter_that_loads(tmp_path):
    # The remedy named filter=pc.field('s.b').is_valid(), which the Loader refuses (filters
    # name top-level columns): a struct's field is read with struct_field.
    vals = [_npy_bytes(np.arange(3, dtype=np.float32) + i) if i != 2 else None for i in range(6)]
    path = str(tmp_path / "s.parquet")
    pq.write_table(pa.table({"a": np.arange(6), "s": pa.StructArray.from_arrays(
        [pa.array(vals, pa.binary())], names=["b"])}), path)
    with pytest.raises(pqloader.InvalidDataError, match=r"column 's.b': the row is null") as e:
        list(pqloader.Loader(path, batch_size=6, null_mask=["s.b"], columns=["a", "s.b"],
                             transforms={"s.b": [T.DecodeNdarray()]}))
    import pyarrow.compute as pc

    remedy = str(e.value).rsplit("filter=", 1)[1]
    assert remedy == "pc.struct_field(pc.field('s'), 'b').is_valid()", remedy
    kept = list(pqloader.Loader(path, batch_size=6, columns=["a", "s.b"], filter=eval(remedy, {"pc": pc}),
                                transforms={"s.b": [T.DecodeNdarray()]}))
    assert kept[0]["a"].tolist() == [0, 1, 3, 4, 5]


@pytest.mark.parametrize("shape", [(1, 1_000_001), (1_000_001, 1)])
def test_a_png_of_a_side_past_a_million_pixels_decodes_as_pil(shape):
    # libpng refuses a side over 10^6 unless told otherwise (its default user limit), as
    # "Invalid IHDR data": a valid 1 MB image, far inside the 2 GiB bound, was "corrupt".
    import zlib
    h, w = shape
    a = (np.arange(h * w) % 251).astype(np.uint8).reshape(h, w)
    raw = b"".join(b"\x00" + a[y].tobytes() for y in range(h))
    data = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", w.to_bytes(4, "big") + h.to_bytes(4, "big")
                                               + bytes([8, 0, 0, 0, 0]))
            + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b""))
    np.testing.assert_array_equal(apply([T.DecodeImage("gray", keepdims=False)], data), a)
    pil = Image.open(io.BytesIO(data))
    np.testing.assert_array_equal(np.asarray(pil.convert("L")), a)


def test_a_png_whose_last_idat_checksum_fails_is_refused_not_taken_as_cut():
    # A file cut in its last IDAT chunk's CRC decodes (every pixel was written): one whose
    # CRC is there but wrong fails at the same place, after the last row, and stays
    # refused (damaged; PIL skips IDAT CRCs). A damaged zlib checksum fails earlier.
    full = encode(skdata.chelsea(), "PNG")
    iend = full.rfind(b"IEND") - 4  # the IEND chunk's length field
    for at, why in ((iend - 2, "IDAT: CRC error"), (iend - 6, "IDAT: incorrect data check")):
        data = bytearray(full)
        data[at] ^= 0x01
        with pytest.raises(pqloader.InvalidDataError, match=f"corrupt PNG data: {why}"):
            apply([T.DecodeImage()], bytes(data))


def test_a_center_crop_past_the_image_limit_is_refused_naming_the_column(tmp_path):
    # CenterCrop pads to any size: a typo'd one allocated up to 16 GiB a sample (Resize
    # refuses past 2 GiB). Refused when the loader is made, where the decoded image's
    # channels are known, and on the data otherwise.
    with pytest.raises(pqloader.InvalidDataError, match="CenterCrop to 70000x70000 .3 channels. would "
                       "exceed the 2 GiB limit of an image"):
        apply([T.DecodeImage(), T.CenterCrop(70000)], encode(photos()["chelsea"], "PNG"))
    with pytest.raises(pqloader.InvalidDataError, match="CenterCrop to 50000x50000 .1 channel. would"):
        apply([T.DecodeImage(mode="gray"), T.CenterCrop(50000)], encode(photos()["chelsea"], "PNG"))
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": [encode(photos()["chelsea"], "PNG")]}), path)
    with pytest.raises(pqloader.UnsupportedTypeError, match="'image'.*CenterCrop to 70000x70000"):
        pqloader.Loader(str(path), transforms={"image": [T.DecodeImage(), T.CenterCrop(70000)]})


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("ops, op", [([T.Resize(8), T.CenterCrop((1, 2**31 - 1))], "CenterCrop"),
                                     ([T.RandomResizedCrop((1, 2**31 - 1))], "RandomResizedCrop")])
def test_a_crop_past_the_image_limit_after_a_resize_or_at_random_is_refused_when_made(
        tmp_path, policy, ops, op):
    # A CenterCrop after a Resize (the two run as one op, which checked the Resize's input
    # only) and a RandomResizedCrop were refused at each row: under "skip" every row was
    # skipped (batches of 0 rows all epoch).
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": [encode(photos()["chelsea"][:6, :8], "PNG")] * 2}), path)
    with pytest.raises(pqloader.UnsupportedTypeError, match=f"'image'.*{op} to 1x2147483647 .3 channels. "
                       "would exceed the 2 GiB limit"):
        pqloader.Loader(str(path), on_decode_error=policy, transforms={"image": [T.DecodeImage(), *ops]})


@pytest.mark.parametrize("cut", [3, 4, 20, 100])
def test_a_jpeg_cut_inside_its_header_says_so(cut):
    # libjpeg reports no error for it, only a size of 0x0 ("image of 0x0").
    data = encode(photos()["chelsea"], "JPEG", quality=90)
    with pytest.raises(pqloader.InvalidDataError, match=f"the file ends inside its header .{cut} bytes"):
        apply([T.DecodeImage()], data[:cut])
    bad_length = data[:4] + b"\xff\xff" + data[6:60]  # APP0's length past the end
    with pytest.raises(pqloader.InvalidDataError, match="a segment length past its end"):
        apply([T.DecodeImage()], bad_length)


def test_a_png_header_libpng_refuses_names_its_reason():
    # libpng's error is "Invalid IHDR data"; why is in the warning before it.
    import struct
    import zlib

    data = bytearray(encode(photos()["chelsea"][:4, :4], "PNG"))
    data[16:20] = struct.pack(">I", 0)  # width 0
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR's CRC, mended
    with pytest.raises(pqloader.InvalidDataError, match="Invalid IHDR data .libpng's last warning: "
                       "Image width is zero in IHDR"):
        apply([T.DecodeImage()], bytes(data))
