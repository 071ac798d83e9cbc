"""After the shards: results, the staged-shard check, the output lock, the commit into the dataset."""
