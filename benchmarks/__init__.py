"""The comparison harness against PyG, torch.compile'd PyG and cuSPARSE: ``python -m benchmarks.run``."""
