"""From corpus to batches (§5.1): reading corpora (local files or the hub), tokenizing, cleaning, batching."""
