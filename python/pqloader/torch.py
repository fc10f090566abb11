"""PyTorch helpers (importing this module imports torch).

Most code needs none of this: ``pqloader.Loader(..., output="torch", device="cuda")``
yields torch batches on the GPU and replaces ``torch.utils.data.DataLoader``.

- :class:`IterableDataset`: a Loader for code that insists on a ``DataLoader``; it
  shards per DataLoader worker process.
- :func:`batch_to_torch`: wrap a NumPy batch as tensors without a copy.

Example:
    >>> import pqloader, pqloader.torch, torch
    >>> ds = pqloader.torch.IterableDataset(pqloader.Loader("data/", batch_size=512, seed=1))
    >>> dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
"""

from pqloader._torch import batch_to_torch
from pqloader._torch_dataset import IterableDataset

__all__ = ["IterableDataset", "batch_to_torch"]
