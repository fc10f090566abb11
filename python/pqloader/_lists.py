"""How list columns whose rows differ in length are batched (``Loader(lists=...)``).

A column of ``list<number>`` (token ids, variable-length features) has rows of
different lengths; a batch then needs a layout:

* ``"ragged"`` (:class:`Ragged`): the rows one after another — ``batch[col]`` holds every
  value of the batch and ``batch[col + "_offsets"]`` the ``batch_size + 1`` row
  boundaries (row i is ``values[offsets[i]:offsets[i + 1]]``; torch:
  ``torch.nested.nested_tensor_from_jagged(values, offsets)``). Zero-copy from Arrow's
  buffers when the batch's rows are consecutive in one row group.
* :class:`Pad`: ``[batch_size, L]`` with ``batch[col + "_length"]``, where L is a fixed
  ``length`` or the longest row of the batch (capped by ``max_length``, rounded up to
  ``multiple_of``); padding and truncation on either side.

Without a choice, every row of a batch must have one length (a column of uniform lists
is a ``[batch_size, n]`` tensor), as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

_SIDES = ("left", "right")

# The longest list the engine makes (kMaxListLength in cpp/src/pqloader/tensor/batch.h):
# Pad(length=2**70) had been a bare std::bad_cast when the Loader was made.
_MAX_LIST_LENGTH = 2**40


def _int(value: Any) -> int | None:
    """`value` as a plain int when it is an int or a NumPy integer (not a bool), else None."""
    from pqloader._state import is_state_int  # (here: _state imports _options, which imports this)

    return int(value) if is_state_int(value) else None


def _set(obj: Any, name: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass (a NumPy scalar as its Python value, so that
    equality, repr and the state's fingerprint do not depend on how it was given)."""
    object.__setattr__(obj, name, value)


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Rows one after another, with ``<column>_offsets`` (see the module docstring)."""

    def _engine(self) -> dict[str, Any]:
        return {"mode": "ragged"}


@dataclasses.dataclass(frozen=True)
class Pad:
    """Pad or truncate every row to one length, with ``<column>_length``.

    Args:
        length: Every row's length (1 to 2**40, as ``max_length`` and ``multiple_of``;
            NumPy ints too); None for the longest row of each batch (dynamic
            padding: batches of short rows stay small).
        max_length: With ``length=None``, rows longer than this are truncated.
        multiple_of: With ``length=None``, the batch's length is rounded up to a
            multiple of this (e.g. 8 or 64 for tensor cores).
        value: The padding value: a number (not a bool) that the column's dtype holds.
        side: Where padding goes: ``"right"`` (after the values) or ``"left"``.
        truncation: Which end of a too-long row is cut: ``"right"`` keeps its first
            values, ``"left"`` its last ones.

    Example:
        >>> pqloader.Loader(src, lists={"tokens": pqloader.Pad(max_length=2048, multiple_of=64)})
    """

    length: int | None = None
    max_length: int | None = None
    multiple_of: int = 1
    value: float = 0
    side: str = "right"
    truncation: str = "right"

    def __post_init__(self) -> None:
        import numbers

        # (NumPy integers too, as the Loader's options take them: np.int64(8) had been
        # "must be a positive int")
        for name in ("length", "max_length", "multiple_of"):
            v = getattr(self, name)
            if v is None and name != "multiple_of":
                continue
            n = _int(v)
            if n is None or n < 1:
                none = "" if name == "multiple_of" else " or None"
                raise ValueError(f"Pad({name}=...) must be a positive int{none}, got {v!r}")
            if n > _MAX_LIST_LENGTH:
                raise ValueError(f"Pad({name}=...) must be at most 2**40 (the longest list the "
                                 f"engine makes), got {v!r}")
            _set(self, name, n)
        # (np.bool_ is no numbers.Real: refused as bool is)
        if isinstance(self.value, (bool, str, bytes)) or not isinstance(self.value, numbers.Real):
            raise TypeError(f"Pad(value=...) must be a number, got {self.value!r}")
        if hasattr(self.value, "item"):
            _set(self, "value", self.value.item())
        try:
            float(self.value)  # (the engine takes it as a double)
        except OverflowError:
            raise ValueError(f"Pad(value=...) is beyond any column's range, got {self.value!r}") from None
        for name in ("side", "truncation"):
            if getattr(self, name) not in _SIDES:
                raise ValueError(f"Pad({name}=...) must be 'left' or 'right', got {getattr(self, name)!r}")
        if self.length is not None and (self.max_length is not None or self.multiple_of != 1):
            raise ValueError("Pad: give a fixed length, or max_length/multiple_of for the batch's "
                             "longest row, not both")

    def _engine(self) -> dict[str, Any]:
        return {"mode": "pad", "length": self.length or 0, "max_length": self.max_length or 0,
                "multiple_of": self.multiple_of, "value": float(self.value), "side": self.side,
                "truncation": self.truncation}


def check_packed_batch(who: str, batch_size: int, seq_len: int) -> None:
    """Refuse batches of ``batch_size`` blocks of ``seq_len`` tokens past the int32 offsets
    of their ``cu_seqlens`` (2**31 - 1 tokens); `who` starts the message ("pack", "mix")."""
    if batch_size * seq_len > 2**31 - 1:
        raise ValueError(f"{who}: batch_size x seq_len = {batch_size} x {seq_len} tokens a batch, beyond "
                         "the int32 offsets of its cu_seqlens (2**31 - 1): use fewer blocks a batch or "
                         "shorter ones")


def check_lists(lists: Any) -> dict[str, Ragged | Pad] | None:
    """Check ``Loader(lists=...)``: {column: "ragged" | Ragged() | Pad(...)}.

    Raises:
        TypeError: Not a dict of those.
    """
    if lists is None:
        return None
    if not isinstance(lists, Mapping):
        raise TypeError(f"lists must be a dict {{column: 'ragged' | pqloader.Pad(...)}}, got {type(lists).__name__}")
    out: dict[str, Ragged | Pad] = {}
    for column, choice in lists.items():
        if not isinstance(column, str):
            raise TypeError(f"lists keys must be column names (str), got {column!r}")
        if choice == "ragged":
            choice = Ragged()
        elif choice == "pad":
            choice = Pad()
        if not isinstance(choice, (Ragged, Pad)):
            raise TypeError(f"lists[{column!r}] must be 'ragged', 'pad', pqloader.Ragged() or "
                            f"pqloader.Pad(...), got {choice!r}")
        out[column] = choice
    return out


@dataclasses.dataclass(frozen=True)
class Pack:
    """Pack documents (the rows of a list column of tokens) into blocks of exactly
    ``seq_len`` tokens, as language-model pre-training consumes them.

    The documents, in the epoch's (shuffled) order, each followed by ``eos`` when given,
    are concatenated and cut into blocks; a batch is ``batch_size`` blocks. A document
    longer than what is left of a block continues in the next one (or, with
    ``truncate=True``, documents longer than a block keep only a block's worth, the
    separator included: ``seq_len - 1`` tokens with ``eos``). Each
    batch holds ``[blocks, seq_len]`` arrays: the tokens (under the column's name),
    ``position_ids`` (a token's index in its document; a continued document goes on
    counting), ``document_ids`` (the segment's index in its block, -1 on padding),
    ``loss_mask`` (False on padding), the int32 ``cu_seqlens`` of the segments over the
    flattened batch (FlashAttention's variable-length API), and per-token copies of the
    other selected columns (numbers, one per document).

    The blocks are a pure function of the data, options, seed, epoch and rank: the same
    for any ``num_workers``, resumable at any batch, and every rank gets the same number
    of blocks (``shard_policy="drop"`` drops the extra ones, ``"pad"`` adds blocks of
    padding). Only the end of a rank's last block is padding (``drop_last=True`` drops
    it). Before the first epoch the lengths of all documents are read (one pass over the
    token column).

    Args:
        column: The list column of tokens.
        seq_len: Tokens per block.
        eos: A separator token appended after every document (None: none). It, and
            ``pad``, must be an int the token column's dtype holds exactly, and within
            ``±2**53`` (the packer writes them through a double: ``2**63 - 1`` in int64
            tokens is refused) (refused when the Loader is made, also from C++).
        truncate: Documents longer than a block keep only its first tokens (with ``eos``,
            ``seq_len - 1`` of them and the separator; ``seq_len`` must then be at least 2).
        pad: The token of padding.

    Example:
        >>> pqloader.Loader(src, columns=["tokens"], batch_size=8, shuffle=True, seed=1,
        ...                 pack=pqloader.Pack("tokens", seq_len=2048, eos=2))
    """

    column: str
    seq_len: int
    eos: int | None = None
    truncate: bool = False
    pad: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise TypeError(f"Pack(column=...) must be a column name, got {self.column!r}")
        import numpy as np

        # (NumPy integers and bools too, as the Loader's options take them)
        seq_len = _int(self.seq_len)
        if seq_len is None or not 0 < seq_len < 2**31:
            raise ValueError(f"Pack(seq_len=...) must be a positive int below 2**31, got {self.seq_len!r}")
        _set(self, "seq_len", seq_len)
        for name in ("eos", "pad"):
            v = getattr(self, name)
            if v is None:
                continue
            n = _int(v)
            if n is None:
                raise TypeError(f"Pack({name}=...) must be an int, got {v!r}")
            if not -2**63 <= n < 2**63:
                raise ValueError(f"Pack({name}={n}) does not fit int64")
            _set(self, name, n)
        if not isinstance(self.truncate, (bool, np.bool_)):
            raise TypeError(f"Pack(truncate=...) must be a bool, got {self.truncate!r}")
        _set(self, "truncate", bool(self.truncate))
        if self.truncate and self.eos is not None and self.seq_len < 2:
            # A block's worth is the separator alone: every document would lose all its
            # tokens and the blocks hold only eos.
            raise ValueError(f"Pack(seq_len={self.seq_len}, eos={self.eos}, truncate=True) leaves no "
                             "room for a document's tokens (truncated documents keep seq_len - 1 "
                             "tokens before eos): use seq_len >= 2, or truncate=False")

    def _engine(self) -> dict[str, Any]:
        return {"column": self.column, "seq_len": self.seq_len, "eos": self.eos,
                "truncate": self.truncate, "pad": float(self.pad)}


def check_pack(pack: Any) -> Pack | None:
    """Check ``Loader(pack=...)``.

    Raises:
        TypeError: Not a :class:`Pack`.
    """
    if pack is not None and not isinstance(pack, Pack):
        raise TypeError(f"pack must be a pqloader.Pack(column, seq_len, ...), got {pack!r}")
    return pack


def made_columns(lists: Mapping[str, Ragged | Pad] | None, pack: Pack | None,
                 transforms: Mapping[str, Any] | None) -> set[str]:
    """The columns a batch gains that no file holds: ``<col>_offsets`` (ragged),
    ``<col>_length`` (``Pad``, a final ``PadOrTruncate``) and packing's outputs. They
    are never null, so a scalar ``fill_null`` does not apply to them (``fill_null=-1``
    was refused for ``loss_mask`` being bool, ``0.5`` in a float column for
    ``position_ids`` or ``<col>_offsets`` being int64)."""
    made = set()
    for column, choice in (lists or {}).items():
        made.add(column + ("_offsets" if isinstance(choice, Ragged) else "_length"))
    if pack is not None:
        made.update(("position_ids", "document_ids", "loss_mask", "cu_seqlens"))
    for column, ops in (transforms.items() if isinstance(transforms, Mapping) else ()):
        last = ops[-1] if isinstance(ops, (list, tuple)) and ops else None
        if getattr(last, "name", None) == "PadOrTruncate":
            made.add(column + "_length")
    return made


def check_values_fit(lists: Mapping[str, Ragged | Pad] | None, pack: Pack | None,
                     transforms: Mapping[str, Any] | None,
                     columns: Mapping[str, Mapping[str, Any]]) -> None:
    """Check that ``Pad(value=)``, ``Pack(eos=, pad=)`` and a final
    ``PadOrTruncate(pad=)`` are values of their column's dtype (``Loader.column_info``):
    they were cast unchecked (``eos=300`` in an int8 column became 44, a token of the
    data; ``pad=-100`` in uint16 65436; ``1e6`` in float16 inf; ``eos=2049`` in float16 2048).

    Raises:
        ValueError: A value the column's dtype cannot hold exactly, naming it.
    """
    import numpy as np

    from pqloader._column_checks import check_value_fits

    checks = [(f"lists[{c!r}]: Pad(value={p.value!r})", c, p.value)
              for c, p in (lists or {}).items() if isinstance(p, Pad)]
    if pack is not None:
        checks += [(f"Pack({name}={getattr(pack, name)!r})", pack.column, getattr(pack, name))
                   for name in ("eos", "pad") if getattr(pack, name) is not None]
    for column, ops in (transforms.items() if isinstance(transforms, Mapping) else ()):
        for op in ops if isinstance(ops, (list, tuple)) else []:
            name, params = op._spec() if hasattr(op, "_spec") else ("", {})
            if name == "PadOrTruncate" and isinstance(params.get("pad"), (int, float)):
                checks.append((f"transforms[{column!r}]: PadOrTruncate(pad={params['pad']!r})",
                               column, params["pad"]))
    for what, column, value in checks:
        dtype = columns.get(column, {}).get("dtype")
        if dtype is None or dtype in ("str", "bytes"):
            continue  # refused elsewhere (a column that is not a list of numbers)
        # (A whole number, a token id, the float dtype rounds is refused there: eos=2049
        # in float16 was 2048.)
        check_value_fits(what, column, value, np.dtype(dtype), as_double=True)
