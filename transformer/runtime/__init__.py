"""Where and how a model runs: device, precision, CPU threads, random state, torch.distributed."""
