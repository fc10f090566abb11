"""``pqloader.petastorm.Loader``: a plain pqloader Loader over a Petastorm dataset, with
every codec decoded by the C++ transforms its Unischema names."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pqloader.petastorm import _dataset
from pqloader.petastorm.codecs import CompressedImageCodec
from pqloader.petastorm.unischema import Unischema, is_numpy_scalar_type


def codec_transforms(schema: Unischema, columns: Sequence[str] | None = None) -> dict[str, list]:
    """``{field: [ops]}`` that decode the codecs of `columns` (default: all) in C++.

    ``CompressedImageCodec`` → ``DecodeImage`` (``mode="gray"`` for (H, W) fields),
    ``NdarrayCodec`` → ``DecodeNdarray``, ``CompressedNdarrayCodec`` →
    ``DecodeCompressedNdarray``; scalar fields need none.
    """
    out = {}
    for name in columns or list(schema.fields):
        field = schema.fields[name]
        if field.codec is not None:
            ops = field.codec.engine_ops(field)
            if ops:
                out[name] = ops
    return out


def Loader(dataset_url: str | Sequence[str], columns: Sequence[str] | None = None, *,  # noqa: N802
           transforms: Mapping[str, Sequence[Any]] | None = None, storage_options: Mapping[str, Any] | None = None,
           batch_transform: Callable[[dict], dict] | None = None, **kwargs: Any) -> Any:
    """A :class:`pqloader.Loader` of a Petastorm dataset whose codecs decode by themselves.

    Each selected field's codec becomes its first C++ transforms (see
    :func:`codec_transforms`); ops you give in ``transforms`` for a field run after them
    (e.g. ``{"image": [T.Resize(256), T.CenterCrop(224)]}`` works on decoded pixels).
    Gray image fields come out as (B, H, W), like Petastorm's, unless ops follow; scalar
    fields take their Unischema NumPy type. ``columns`` is a list of field names or
    UnischemaFields (a single str is a ``TypeError``). Other arguments are the Loader's.

    Example:
        >>> loader = pqloader.petastorm.Loader("file:///data/ds", columns=["image", "label"],
        ...                                    batch_size=64, shuffle=True, seed=1)
    """
    import pqloader

    ds = _dataset.open_dataset(dataset_url, _dataset.storage_options_from(storage_options, None))
    schema = ds.unischema
    if schema is None:
        from pqloader.petastorm.errors import PetastormMetadataError

        raise PetastormMetadataError(f"'{ds.sources[0]}' has no Petastorm Unischema in _common_metadata; "
                                     "read it with pqloader.Loader directly")
    if isinstance(columns, (str, bytes)):
        # (list("image") was the columns ['i', 'm', ...]: "unknown columns", or, where such
        # one-letter fields exist, those fields, silently)
        raise TypeError(f"columns must be a list of names, not a {type(columns).__name__} ({columns!r}); "
                        f"give [{columns!r}]")
    # A UnischemaField (this package's or Petastorm's namedtuple) stands for its name, as
    # in make_reader's schema_fields.
    names = ([c.name if isinstance(c, tuple) and hasattr(c, "_fields") and isinstance(getattr(c, "name", None), str)
              else c for c in columns] if columns is not None else list(schema.fields))
    unknown = [n for n in names if n not in schema.fields]
    if unknown:
        raise pqloader.ColumnNotFoundError(f"columns {unknown} are not fields of the Unischema "
                                           f"({', '.join(schema.fields)})")
    ops = codec_transforms(schema, names)
    user = dict(transforms or {})
    for name, extra in user.items():
        ops[name] = list(ops.get(name, [])) + (list(extra) if isinstance(extra, Sequence) else [extra])
    squeeze = {n for n in names if isinstance(schema.fields[n].codec, CompressedImageCodec)
               and len(schema.fields[n].shape) == 2 and n not in user}
    casts = {n: np.dtype(f.numpy_dtype) for n in names for f in [schema.fields[n]]
             if n not in ops and f.shape == () and is_numpy_scalar_type(f.numpy_dtype)
             and np.dtype(f.numpy_dtype).kind in "biuf"}

    def fix(batch: dict) -> dict:
        for n in squeeze:
            v = batch[n]
            if isinstance(v, np.ndarray) and v.ndim == 4 and v.shape[-1] == 1:
                batch[n] = v.reshape(v.shape[:-1])
        for n, dtype in casts.items():
            v = batch[n]
            if isinstance(v, np.ndarray) and v.dtype != dtype:
                batch[n] = v.astype(dtype)
        return batch if batch_transform is None else batch_transform(batch)

    needs_fix = bool(squeeze or casts) or batch_transform is not None
    return pqloader.Loader(ds.sources, columns=names, transforms=ops or None,
                           storage_options=ds.storage or None,
                           batch_transform=fix if needs_fix else None, **kwargs)
