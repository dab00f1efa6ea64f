"""Files on disk, owned in one place: atomic writes and hashing (:mod:`~transformer_xl.store.files`), safetensors state
dicts and their headers (:mod:`~transformer_xl.store.tensors`), SHA-256 manifests
(:mod:`~transformer_xl.store.manifest`), the names
and resolution of model, checkpoint and run directories (:mod:`~transformer_xl.store.layout`) and training checkpoints
(:mod:`~transformer_xl.store.checkpoint`). Imports nothing of the model or the data."""
