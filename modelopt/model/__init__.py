"""The model under compression: loading it, its compressible layers, and the workload it runs in."""
