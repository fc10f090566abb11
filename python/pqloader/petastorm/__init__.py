"""Petastorm's API on pqloader's engine: change the import, keep the code.

    from pqloader.petastorm import make_reader            # was: from petastorm import make_reader
    from pqloader.petastorm.pytorch import DataLoader     # was: from petastorm.pytorch import ...

``make_reader`` reads the dataset's pickled Unischema with a restricted reader (no pickle
is executed), decodes every codec in C++ worker threads, and yields rows as namedtuples
in a deterministic order; ``pytorch.DataLoader`` asks for whole batches instead of
collating rows in Python. See docs/migrating_from_petastorm.md for every call and
parameter side by side.
"""

from pqloader.petastorm.errors import NoDataAvailableError, PetastormMetadataError, UntrustedSchemaError
from pqloader.petastorm.reader import Reader, make_batch_reader, make_reader
from pqloader.petastorm.transform import TransformSpec
from pqloader.petastorm._loader import Loader, codec_transforms

__all__ = ["make_reader", "make_batch_reader", "TransformSpec", "Reader", "Loader", "codec_transforms",
           "UntrustedSchemaError", "PetastormMetadataError", "NoDataAvailableError"]
