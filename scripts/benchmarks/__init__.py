"""The parts of scripts/benchmark.py: workload, training, decoding, memory and the printed report."""
