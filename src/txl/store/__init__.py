"""Files on disk, owned in one place: atomic writes and hashing (:mod:`~txl.store.files`), safetensors state
dicts and their headers (:mod:`~txl.store.tensors`), SHA-256 manifests (:mod:`~txl.store.manifest`), the names
and resolution of model, checkpoint and run directories (:mod:`~txl.store.layout`) and training checkpoints
(:mod:`~txl.store.checkpoint`). Imports nothing of the model or the data."""
