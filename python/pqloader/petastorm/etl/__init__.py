"""Writing Petastorm datasets: ``materialize_dataset`` (see :mod:`.dataset_metadata`)."""
