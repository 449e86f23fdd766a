"""The bottom layer: configuration (every environment variable), the on-disk layout, the data
model (chunks, nodes, relations), the error hierarchy, stage code versions, atomic writes and
fault points. Imports nothing else of mtrag."""
