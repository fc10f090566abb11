"""PyTorch helpers (importing this module imports torch).

Most code needs none of this: ``pqloader.Loader(..., output="torch", device="cuda")``
yields torch batches on the GPU and replaces ``torch.utils.data.DataLoader``.

- :class:`IterableDataset`: a Loader for code that insists on a ``DataLoader``; it
  shards per DataLoader worker process. :class:`DataLoader` iterates it with
  checkpoints (exact and elastic resume).
- :func:`gather_state_dict`: one state for all ranks; :class:`Checkpoint`: a loader as
  an entry of a ``torch.distributed.checkpoint`` state dict.
- :func:`batch_to_torch`: wrap a NumPy batch as tensors without a copy.

Example:
    >>> import pqloader, pqloader.torch, torch
    >>> ds = pqloader.torch.IterableDataset(pqloader.Loader("data/", batch_size=512, seed=1))
    >>> dl = pqloader.torch.DataLoader(ds, num_workers=2)
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # (a bare "No module named 'torch'" named no remedy)
    raise ImportError("pqloader.torch needs PyTorch, which is not installed: pip install "
                      "'pqloader[torch]' (or torch itself)") from e

from pqloader._torch import batch_to_torch
from pqloader._torch_checkpoint import Checkpoint, gather_state_dict
from pqloader._torch_dataset import DataLoader, IterableDataset

__all__ = ["Checkpoint", "DataLoader", "IterableDataset", "batch_to_torch", "gather_state_dict"]
