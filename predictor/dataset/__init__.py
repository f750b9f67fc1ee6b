"""The traced training-job dataset: architecture templates, traced labels, calibration, generation.

`templates` turns a JobSpec into a concrete `torch.nn` model, `tracing` measures one training step
of it without allocating real memory, `calibration` maps traced tensor bytes to what nvidia-smi
shows, and `generate` is the `deepres dataset` command that samples jobs and writes the CSV.
"""
