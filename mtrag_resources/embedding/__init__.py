"""Texts -> vectors: the embedder and its fingerprint, the model's files, the ONNX export and int8
runtime, and the int8 calibration. Imports only `core`."""
