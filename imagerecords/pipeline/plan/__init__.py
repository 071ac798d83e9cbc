"""The plan of a build: refs and labels, split and label assignment, shard order, the shard plan, appends."""
